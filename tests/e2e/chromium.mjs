// How the page tests and the browser benchmark start Chromium: the system Chromium, headless,
// with WebGPU on and everything that would touch the (closed) network off (see DESIGN.md).
export const CHROMIUM_ARGS = ['--enable-unsafe-webgpu', '--disable-background-networking', '--disable-component-update',
  '--disable-sync', '--no-first-run', '--disable-quic', ...(process.getuid && process.getuid() === 0 ? ['--no-sandbox'] : [])];
