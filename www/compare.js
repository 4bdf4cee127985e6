// Comparing the loaded trace (A) with another (B): both allocated and reserved curves on one
// event axis, and the difference of the two peaks attributed to where memory was allocated (the
// groups of each timeline: the user's frame, or the autograd node).
import { escapeHtml as escape, formatBytes, ticks } from './format.js';
import { prepareCanvas } from './canvas.js';
import { HEADROOM } from './palette.js';


function signed(bytes) {
  return bytes === 0 ? '0 B' : `${bytes > 0 ? '+' : '−'}${formatBytes(Math.abs(bytes))}`;
}

// The peak difference by group: [{name, a, b, diff}] sorted by the size of the difference. A
// group is the same in both traces when its kind and name are (a frame named like a category
// is not that category).
export function attribute(groupsA, groupsB) {
  const rows = new Map();
  const key = (g) => `${g.kind}\u0000${g.name}`;
  for (const g of groupsA) rows.set(key(g), { name: g.name, a: g.bytes_at_peak, b: 0 });
  for (const g of groupsB) {
    const row = rows.get(key(g)) || { name: g.name, a: 0, b: 0 };
    row.b += g.bytes_at_peak;
    rows.set(key(g), row);
  }
  return [...rows.values()].map((r) => ({ ...r, diff: r.b - r.a })).filter((r) => r.diff !== 0)
    .sort((x, y) => Math.abs(y.diff) - Math.abs(x.diff));
}

export function showComparison(container, a, b) {
  const sa = a.meta.summary;
  const sb = b.summary;
  const rows = attribute(a.meta.groups, b.groups);
  const max = Math.max(1, ...rows.slice(0, 12).map((r) => Math.abs(r.diff)));
  container.innerHTML = `
    <table class="compare-figures">
      <tr><th></th><th class="num">A: ${escape(a.name)}</th><th class="num">B: ${escape(b.name)}</th><th class="num">B − A</th></tr>
      <tr><td>peak allocated</td><td class="num">${formatBytes(sa.peak_allocated_bytes)}</td><td class="num" data-testid="compare-peak-allocated" data-bytes="${sb.peak_allocated_bytes}">${formatBytes(sb.peak_allocated_bytes)}</td><td class="num">${signed(sb.peak_allocated_bytes - sa.peak_allocated_bytes)}</td></tr>
      <tr><td>peak reserved</td><td class="num">${formatBytes(sa.peak_reserved_bytes)}</td><td class="num" data-testid="compare-peak-reserved" data-bytes="${sb.peak_reserved_bytes}">${formatBytes(sb.peak_reserved_bytes)}</td><td class="num">${signed(sb.peak_reserved_bytes - sa.peak_reserved_bytes)}</td></tr>
      <tr><td>events</td><td class="num">${sa.events.toLocaleString('en-US')}</td><td class="num">${sb.events.toLocaleString('en-US')}</td><td></td></tr>
    </table>
    <div class="compare-keys"><span><i class="line a-alloc"></i>A allocated</span><span><i class="line a-res"></i>A reserved</span>
      <span><i class="line b-alloc"></i>B allocated</span><span><i class="line b-res"></i>B reserved</span></div>
    <canvas id="compare-chart" aria-label="Both traces' curves on one axis"></canvas>
    <h3>Where the peaks differ</h3>
    ${rows.length ? `<table data-testid="compare-attribution"><tr><th>allocated at</th><th class="num">A at its peak</th><th class="num">B at its peak</th><th class="num">B − A</th></tr>
      ${rows.slice(0, 12).map((r) => `<tr><td class="bar-cell"><i style="width:${(100 * Math.abs(r.diff)) / max}%;background:${r.diff > 0 ? '#f6d2ce' : '#d3e6d0'}"></i><span>${escape(r.name)}</span></td>
        <td class="num">${formatBytes(r.a)}</td><td class="num">${formatBytes(r.b)}</td><td class="num">${signed(r.diff)}</td></tr>`).join('')}</table>`
    : '<p class="muted">The same bytes are live at both peaks, allocated at the same places.</p>'}`;
  drawCurves(container.querySelector('#compare-chart'), a.arrays, b.arrays);
}

function drawCurves(canvas, a, b) {
  const height = 220;
  const margin = { left: 74, right: 24, top: 10, bottom: 22 };
  const { ctx, width } = prepareCanvas(canvas, height);
  const w = width - margin.left - margin.right;
  const h = height - margin.top - margin.bottom;
  const n = Math.max(a.allocated.length, b.allocated.length);
  let ymax = 1;
  for (const arr of [a.allocated, a.reserved, b.allocated, b.reserved]) for (const v of arr) if (v > ymax) ymax = v;
  ymax *= HEADROOM;
  ctx.fillStyle = '#667085';
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (const v of ticks(0, ymax / HEADROOM, 4, true)) {
    const y = margin.top + h - (v / ymax) * h;
    ctx.fillText(formatBytes(Math.round(v)), margin.left - 6, y);
    ctx.strokeStyle = '#eceef2';
    ctx.beginPath();
    ctx.moveTo(margin.left, Math.round(y) + 0.5);
    ctx.lineTo(margin.left + w, Math.round(y) + 0.5);
    ctx.stroke();
  }
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  const events = ticks(0, n - 1, 5, false);
  events.forEach((v, k) => {
    ctx.textAlign = k === 0 ? 'left' : k === events.length - 1 && v > (n - 1) * 0.9 ? 'right' : 'center';
    ctx.fillText(String(v), margin.left + (v / Math.max(1, n - 1)) * w, margin.top + h + 6);
  });
  // Each curve: the maximum of every pixel column, so no peak is lost.
  const line = (values, color, dash) => {
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.6;
    ctx.setLineDash(dash);
    ctx.beginPath();
    const columns = new Float64Array(Math.ceil(w) + 1).fill(-1);
    for (let i = 0; i < values.length; i++) {
      const c = Math.floor((i / Math.max(1, n - 1)) * w);
      if (values[i] > columns[c]) columns[c] = values[i];
    }
    let started = false;
    for (let c = 0; c < columns.length; c++) {
      if (columns[c] < 0) continue;
      const y = margin.top + h - (columns[c] / ymax) * h;
      if (started) ctx.lineTo(margin.left + c, y); else { ctx.moveTo(margin.left + c, y); started = true; }
    }
    ctx.stroke();
    ctx.setLineDash([]);
  };
  line(a.reserved, '#d0453a', []);
  line(a.allocated, '#3a5bd9', []);
  line(b.reserved, '#d0453a', [6, 4]);
  line(b.allocated, '#3a5bd9', [6, 4]);
}
