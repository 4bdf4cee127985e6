// Sizing a canvas for crisp drawing: CSS height as given, width from its box, backing store in
// device pixels, and a context that draws in CSS pixels with the page's small font.
export function prepareCanvas(canvas, height) {
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.parentElement.clientWidth;
  canvas.style.height = `${height}px`;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = '11px system-ui, sans-serif';
  ctx.textBaseline = 'middle';
  return { ctx, width };
}

// Dark text on light fills, white on dark ones: labels stay readable on every band colour.
// The context normalises any CSS colour to #rrggbb when it is assigned.
export function textColorOn(ctx, fill) {
  ctx.fillStyle = fill;
  const hex = ctx.fillStyle;
  if (!/^#[0-9a-f]{6}$/i.test(hex)) return '#111827';
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255);
  const luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return luminance < 0.5 ? '#ffffff' : '#111827';
}
