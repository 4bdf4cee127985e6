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
