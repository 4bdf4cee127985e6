// Formatting shared by the page's modules: byte counts as PyTorch prints them, and text made safe
// for innerHTML (frame names and file paths come from the user's file).

export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}

export function formatBytes(bytes) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Math.abs(bytes);
  let u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  const sign = bytes < 0 ? '-' : '';
  return u === 0 ? `${sign}${v} B` : `${sign}${v.toFixed(2)} ${units[u]}`;
}

// "Nice" tick values covering [lo, hi] with about `count` steps (powers of two for bytes).
export function ticks(lo, hi, count, binary) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / count;
  let step;
  if (binary && raw >= 1024) {
    step = 2 ** Math.ceil(Math.log2(raw));
    if (step / 2 >= raw) step /= 2;
  } else {
    const p = 10 ** Math.floor(Math.log10(raw));
    step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
  }
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

// Microseconds as the time axis labels them: µs, ms or s.
export function formatTime(us) {
  const a = Math.abs(us);
  if (a >= 1e6) return `${(us / 1e6).toFixed(a >= 1e7 ? 1 : 2)} s`;
  if (a >= 1e3) return `${(us / 1e3).toFixed(a >= 1e4 ? 0 : 1)} ms`;
  return `${Math.round(us)} µs`;
}
