// The "What fits" view: two or three snapshots of one program at small sizes, each with the
// value it was recorded at (context=128), predict the program at a target value and find the
// largest value that fits a card (`tensormem predict`, run in the worker): the predicted curve
// beside the recorded ones, the peaks per value with the card's memory as a line, and the
// largest value that fits, with the recordings' settings and with expandable_segments:True.
import { escapeHtml as escape, formatBytes, ticks } from './format.js';
import { prepareCanvas } from './canvas.js';
import { latestOnly } from './job.js';

const SLOTS = 3;
const RECORDED_COLORS = ['#2563eb', '#0d9488', '#7c3aed'];
const PREDICTED = '#dc2626';
const $ = (id) => document.getElementById(id);

// `context=128` or `batch=4,context=128` as {name: value}; null where it does not read so.
export function parseValues(text) {
  const out = {};
  const items = String(text).split(',').map((s) => s.trim()).filter(Boolean);
  if (!items.length) return null;
  for (const item of items) {
    const m = /^([A-Za-z_]\w*)\s*=\s*(\d+)$/.exec(item);
    if (!m) return null;
    out[m[1]] = Number(m[2]);
  }
  return out;
}

// The variable the view predicts along: the one whose values differ between the recordings, else
// the first one named.
export function variableOf(valueSets) {
  const names = Object.keys(valueSets[0] || {});
  return names.find((n) => valueSets.some((v) => v[n] !== valueSets[0][n])) || names[0];
}

export function setUpFits({ ask, load, presets, showProgress, hideProgress, download }) {
  const slots = [];
  const rows = $('fits-recordings');
  for (let k = 0; k < SLOTS; k++) {
    const row = document.createElement('div');
    row.className = 'fits-row';
    row.innerHTML = `<i class="swatch-line" style="background:${RECORDED_COLORS[k]}"></i>
      <label class="button">${k < 2 ? 'Snapshot' : 'Third snapshot (optional)'}…
        <input type="file" data-testid="fits-file-${k}" accept=".pickle,.pkl,.json,application/octet-stream,application/json" hidden></label>
      <span class="fits-name muted">none</span>
      <label>recorded at <input data-testid="fits-values-${k}" size="14" placeholder="${k === 0 ? 'context=128' : k === 1 ? 'context=256' : 'context=512'}"></label>
      <button class="link fits-remove" hidden>remove</button>`;
    rows.appendChild(row);
    const slot = { row, file: null, overview: null, name: row.querySelector('.fits-name') };
    row.querySelector('input[type=file]').addEventListener('change', (e) => {
      if (e.target.files[0]) open(k, e.target.files[0]);
      e.target.value = '';
    });
    row.querySelector('.fits-remove').onclick = () => {
      ask('fitsClear', { slot: k });
      Object.assign(slot, { file: null, overview: null });
      slot.name.textContent = 'none';
      row.querySelector('.fits-remove').hidden = true;
    };
    slots.push(slot);
  }
  $('fits-card-select').replaceChildren(
    new Option('no card: unlimited memory', ''),
    ...presets.map((p) => new Option(`${p.name} (${formatBytes(p.bytes)})`, p.name)),
    new Option('memory of your own…', 'custom'),
  );
  $('fits-card-select').value = 'H100-80GB';
  $('fits-card-select').onchange = () => { $('fits-capacity-box').hidden = $('fits-card-select').value !== 'custom'; };
  $('fits-run').onclick = () => predict();
  // The predicted trace on the timeline above, as a file would be.
  let shown = '';
  $('fits-open').onclick = async () => {
    await load('fitsOpenPredicted', { name: shown });
    document.querySelector('.timeline-card').scrollIntoView();
  };
  $('fits-export').onclick = async () => {
    try {
      download(await ask('fitsExport'), 'predicted', 'pickle');
    } catch (e) {
      showError(e.message);
    }
  };

  // A file dropped on this card is a recording of it (the first empty slot), not the page's trace.
  window.addEventListener('drop', (e) => {
    const box = $('fits-card').getBoundingClientRect();
    const inside = e.clientX >= box.left && e.clientX <= box.right && e.clientY >= box.top && e.clientY <= box.bottom;
    if (!inside || !e.dataTransfer?.files?.length) return;
    e.preventDefault();
    e.stopImmediatePropagation();
    $('drop').hidden = true;
    let k = slots.findIndex((s) => !s.file);
    for (const file of e.dataTransfer.files) {
      if (k < 0 || k >= SLOTS) break;
      open(k, file);
      k = slots.findIndex((s, i) => i > k && !s.file);
    }
  }, true);

  function showError(message) {
    hideProgress();
    $('fits-error').textContent = message;
    $('fits-error').hidden = false;
  }
  function clearError() { $('fits-error').hidden = true; }

  async function open(k, file) {
    clearError();
    const slot = slots[k];
    slot.name.textContent = `reading ${file.name}…`;
    try {
      const { overview } = await ask('fitsOpen', { slot: k, file });
      Object.assign(slot, { file: file.name, overview });
      slot.name.textContent = `${file.name} · peak ${formatBytes(overview.peak_allocated_bytes)} allocated, ${formatBytes(overview.peak_reserved_bytes)} reserved`;
      slot.row.querySelector('.fits-remove').hidden = false;
      // A value in the file's name (…ctx256…, …context=256…) is offered, not imposed.
      const input = slot.row.querySelector(`[data-testid=fits-values-${k}]`);
      const guess = /(?:context|ctx)[=_-]?(\d+)/i.exec(file.name);
      if (!input.value && guess) input.value = `context=${guess[1]}`;
    } catch (e) {
      Object.assign(slot, { file: null, overview: null });
      slot.name.textContent = 'none';
      showError(`Could not load ${file.name}: ${e.message}`);
    } finally {
      hideProgress();
    }
  }

  // The request from the inputs, or an error in words.
  function request() {
    const used = slots.map((s, k) => ({ s, k })).filter(({ s }) => s.file);
    if (used.length < 2) throw new Error('pick two or three snapshots of the same program (recorded at different values)');
    const values = used.map(({ s, k }) => {
      const text = slots[k].row.querySelector(`[data-testid=fits-values-${k}]`).value.trim();
      if (!text) throw new Error(`${s.file}: say which value it was recorded at, e.g. context=128`);
      if (!parseValues(text)) throw new Error(`${s.file}: "${text}" is not name=value (e.g. context=128)`);
      return text;
    });
    const variable = variableOf(values.map(parseValues));
    let to = $('fits-target').value.trim();
    if (/^\d+$/.test(to)) to = `${variable}=${to}`;
    if (to && !parseValues(to)) throw new Error(`target "${to}" is not a value (e.g. 1024 or ${variable}=1024)`);
    const card = $('fits-card-select').value;
    const capacity = card === 'custom' ? $('fits-capacity').value.trim() : card;
    if (!to && !capacity) throw new Error('set a target value, or a card to find the largest value that fits');
    return {
      slots: used.map(({ k }) => k),
      names: used.map(({ s }) => s.file),
      request: { values, to, fit: capacity ? variable : '', capacity, alloc_conf: $('fits-conf').value.trim(), points: 12 },
      card: card === 'custom' ? capacity : card,
    };
  }

  const predict = latestOnly({
    button: $('fits-run'),
    status: $('fits-status'),
    read: request,
    busy: () => 'predicting…',
    work: (r) => {
      showProgress('predicting', 0);
      return ask('fitsPredict', { slots: r.slots, request: r.request });
    },
    show: (r, out) => show(out, r),
    fail: () => {
      $('fits-result').replaceChildren();
      $('fits-export').hidden = true;
      $('fits-open').hidden = true;
    },
    showError,
    clearError,
    hideProgress,
  });

  function show(out, r) {
    const p = out.prediction;
    const h = p.how_sure;
    const target = Object.entries(p.target).map(([k, v]) => `${k}=${v}`).join(', ');
    const f = p.fit;
    const largest = (v) => (v == null ? `none (not even ${f.variable}=1)` : v >= f.search_limit ? `${v.toLocaleString('en-US')} or more` : v.toLocaleString('en-US'));
    const laws = p.laws.filter((l) => !l.constant).slice(0, 8);
    $('fits-result').innerHTML = `
      ${out.weak ? '<p class="warning">One recording: the laws are guesses from the sizes\' factors.</p>' : ''}
      <table class="compare-figures" data-testid="fits-figures">
        <tr><th>predicted at ${escape(target)}</th><th class="num"></th></tr>
        <tr><td>peak allocated</td><td class="num" data-testid="fits-peak-allocated" data-bytes="${p.peak_allocated_bytes}">${formatBytes(p.peak_allocated_bytes)}</td></tr>
        <tr><td>peak reserved</td><td class="num" data-testid="fits-peak-reserved" data-bytes="${p.peak_reserved_bytes}">${formatBytes(p.peak_reserved_bytes)}</td></tr>
        <tr><td>peak phase</td><td class="num">${escape(p.peak_phase || 'unknown')}</td></tr>
        <tr><td>out of memory${out.capacity_bytes ? ` on ${escape(r.card)}` : ''}</td><td class="num" data-testid="fits-oom">${p.out_of_memory ? escape(p.out_of_memory) : 'no'}</td></tr>
        <tr><td>aligned</td><td class="num">${(100 * p.aligned_fraction).toFixed(2)}% of allocations; ${formatBytes(p.unaligned_bytes)} unaligned</td></tr>
        <tr><td>how sure</td><td class="num" data-testid="fits-how-sure" data-checked-share="${h.checked_share}"
          title="${formatBytes(h.extrapolated_bytes)} on laws only fitted through the recordings; ${formatBytes(h.recorded_size_bytes)} at a recorded size">
          ${(100 * h.checked_share).toFixed(1)}% of the bytes at the peak on laws a recording checks</td></tr>
      </table>
      ${h.warning ? `<p class="warning" data-testid="fits-warning">${escape(h.warning)}</p>` : ''}
      ${(p.warnings || []).map((w) => `<p class="warning" data-testid="fits-mislabeled">${escape(w)}</p>`).join('')}
      ${f ? `<p class="fits-largest" data-testid="fits-largest" data-value="${f.largest ?? ''}" data-expandable="${f.largest_expandable ?? ''}">
        Largest ${escape(f.variable)} that fits ${escape(r.card)} (${formatBytes(f.capacity_bytes)}):
        <strong>${largest(f.largest)}</strong> with ${f.settings === '(defaults)' ? 'the default settings' : escape(f.settings)};
        <strong>${largest(f.largest_expandable)}</strong> with ${escape(f.expandable_settings)}
        <span class="muted">(${f.replays} predictions replayed)</span></p>
        ${f.warning ? `<p class="warning" data-testid="fits-largest-warning">${escape(f.warning)}</p>` : ''}` : ''}
      <h3>Memory over the run: recorded and predicted</h3>
      <div class="compare-keys">${r.names.map((n, i) => `<span><i class="line" style="border-color:${RECORDED_COLORS[r.slots[i]]}"></i>${escape(n)} (${escape(r.request.values[i])})</span>`).join('')}
        <span><i class="line" style="border-color:${PREDICTED}"></i>predicted at ${escape(target)}</span>
        <span class="muted">solid: allocated · dashed: reserved · x: share of each run's events</span></div>
      <canvas id="fits-curves" data-testid="fits-curves" aria-label="Recorded and predicted memory curves"></canvas>
      ${out.sweep ? `<h3>Peak per ${escape(out.sweep.variable)} (each one replayed)</h3>
        <div class="compare-keys"><span><i class="line" style="border-color:${PREDICTED}"></i>peak reserved</span><span><i class="line" style="border-color:#2563eb"></i>peak allocated</span>
        ${out.capacity_bytes ? `<span><i class="line" style="border-color:#111827;border-top-style:dashed"></i>${escape(r.card)}</span>` : ''}
        <span class="muted">dots: values replayed; rings: recorded values</span></div>
        <canvas id="fits-sweep" data-testid="fits-sweep" aria-label="Predicted peak memory per value"></canvas>
        <details><summary>the values</summary><table data-testid="fits-sweep-table"><tr><th class="num">${escape(out.sweep.variable)}</th><th class="num">peak allocated</th><th class="num">peak reserved</th></tr>
        ${out.sweep.points.map((q) => `<tr><td class="num">${q.value}</td><td class="num">${formatBytes(q.peak_allocated_bytes)}</td><td class="num">${formatBytes(q.peak_reserved_bytes)}</td></tr>`).join('')}</table></details>` : ''}
      ${laws.length ? `<h3>What grows</h3><table><tr><th class="num">at the target</th><th class="num">allocations</th><th>law</th><th>stack</th></tr>
        ${laws.map((l) => `<tr><td class="num">${formatBytes(l.target_bytes)}</td><td class="num">${l.allocations}</td><td><code>${escape(l.law)}</code></td><td>${escape(l.stack)}</td></tr>`).join('')}</table>` : ''}
      ${out.notes.length ? `<ul class="warnings">${out.notes.map((n) => `<li>${escape(n)}</li>`).join('')}</ul>` : ''}`;
    $('fits-export').hidden = false;
    $('fits-open').hidden = false;
    shown = `predicted at ${target}`;
    drawCurves($('fits-curves'), r.slots.map((k) => ({ color: RECORDED_COLORS[k], ...slots[k].overview })), { color: PREDICTED, ...out.curve });
    if (out.sweep) {
      const recorded = r.request.values.map((v) => parseValues(v)[out.sweep.variable]);
      drawSweep($('fits-sweep'), out.sweep.points, out.capacity_bytes, f, recorded);
    }
  }
}

const MARGIN = { left: 74, right: 24, top: 10, bottom: 26 };

function yAxis(ctx, width, h, ymax) {
  ctx.strokeStyle = '#e5e7eb';
  ctx.fillStyle = '#6b7280';
  ctx.textAlign = 'right';
  for (const v of ticks(0, ymax, 5, true)) {
    const y = MARGIN.top + h - (v / ymax) * h;
    ctx.beginPath(); ctx.moveTo(MARGIN.left, y); ctx.lineTo(width - MARGIN.right, y); ctx.stroke();
    ctx.fillText(formatBytes(v), MARGIN.left - 6, y);
  }
}

// Each curve over its own run (x: the share of its events), allocated solid, reserved dashed.
function drawCurves(canvas, recorded, predicted) {
  const height = 240;
  const { ctx, width } = prepareCanvas(canvas, height);
  const w = width - MARGIN.left - MARGIN.right;
  const h = height - MARGIN.top - MARGIN.bottom;
  const all = [...recorded, predicted];
  const ymax = Math.max(1, ...all.map((c) => Math.max(...c.reserved, ...c.allocated))) * 1.05;
  yAxis(ctx, width, h, ymax);
  ctx.textAlign = 'center';
  for (const t of [0, 0.25, 0.5, 0.75, 1]) ctx.fillText(`${t * 100}%`, MARGIN.left + t * w, height - 10);
  for (const c of all) {
    for (const [values, dash] of [[c.reserved, [5, 3]], [c.allocated, []]]) {
      ctx.strokeStyle = c.color;
      ctx.lineWidth = c === predicted ? 2 : 1.5;
      ctx.setLineDash(dash);
      ctx.beginPath();
      values.forEach((v, i) => {
        const x = MARGIN.left + (values.length > 1 ? i / (values.length - 1) : 0) * w;
        const y = MARGIN.top + h - (v / ymax) * h;
        if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      });
      ctx.stroke();
    }
  }
  ctx.setLineDash([]);
}

// Peak allocated and reserved per value, the card's memory as a line, the largest values that
// fit marked.
function drawSweep(canvas, points, capacity, fit, recorded) {
  const height = 260;
  const { ctx, width } = prepareCanvas(canvas, height);
  const w = width - MARGIN.left - MARGIN.right;
  const h = height - MARGIN.top - MARGIN.bottom;
  const xmax = Math.max(...points.map((q) => q.value));
  const xmin = Math.min(...points.map((q) => q.value));
  const ymax = Math.max(1, capacity || 0, ...points.map((q) => q.peak_reserved_bytes)) * 1.08;
  const X = (v) => MARGIN.left + (xmax > xmin ? (v - xmin) / (xmax - xmin) : 0.5) * w;
  const Y = (b) => MARGIN.top + h - (b / ymax) * h;
  yAxis(ctx, width, h, ymax);
  ctx.fillStyle = '#6b7280';
  ctx.textAlign = 'center';
  for (const v of ticks(xmin, xmax, 8, false)) ctx.fillText(v.toLocaleString('en-US'), X(v), height - 10);
  if (fit) {
    for (const [v, label] of [[fit.largest, 'fits'], [fit.largest_expandable, 'fits, expandable']]) {
      if (v == null || v > xmax) continue;
      ctx.strokeStyle = '#16a34a';
      ctx.setLineDash([2, 3]);
      ctx.beginPath(); ctx.moveTo(X(v), MARGIN.top); ctx.lineTo(X(v), MARGIN.top + h); ctx.stroke();
      ctx.fillStyle = '#166534';
      ctx.textAlign = label === 'fits' ? 'right' : 'left';
      ctx.fillText(`${label}: ${v.toLocaleString('en-US')}`, X(v) + (label === 'fits' ? -4 : 4), MARGIN.top + 8);
    }
  }
  if (capacity) {
    ctx.strokeStyle = '#111827';
    ctx.setLineDash([6, 4]);
    ctx.beginPath(); ctx.moveTo(MARGIN.left, Y(capacity)); ctx.lineTo(width - MARGIN.right, Y(capacity)); ctx.stroke();
  }
  ctx.setLineDash([]);
  for (const [key, color] of [['peak_reserved_bytes', PREDICTED], ['peak_allocated_bytes', '#2563eb']]) {
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((q, i) => { if (i) ctx.lineTo(X(q.value), Y(q[key])); else ctx.moveTo(X(q.value), Y(q[key])); });
    ctx.stroke();
    for (const q of points) {
      ctx.beginPath();
      if (recorded.includes(q.value)) { ctx.lineWidth = 1.5; ctx.arc(X(q.value), Y(q[key]), 5, 0, 2 * Math.PI); ctx.stroke(); }
      ctx.beginPath(); ctx.arc(X(q.value), Y(q[key]), 2.5, 0, 2 * Math.PI); ctx.fill();
    }
  }
  ctx.lineWidth = 1;
}
