// The page: inputs (file picker, drag and drop, ?file= URL, scenarios), the figures and test
// hooks, and the panels around the timeline. Heavy work goes to the worker (worker.js).
import { Timeline } from './timeline.js';
import { hitTest } from './hit.js';
import { escapeHtml as escape, formatBytes } from './format.js';
import { drawSegments, describeState, privatePools, DEFAULT_POOL } from './segments.js';
import { applyFilter, streamsOf } from './filter.js';
import { Icicle, buildTree } from './icicle.js';
import { showComparison } from './compare.js';
import { UNKNOWN } from './palette.js';
import { setUpFits } from './fits.js';
import { setUpSize } from './size.js';
import { showFindings, allocationsOf, momentOf, verdictRow, verifiedText, isProblem } from './diagnosis.js';
import { connect, DOCTOR_APART, doctorApart, openForDoctor, findingsOf, dropDoctor } from './workers.js';
import { setUpScenarios } from './scenarios-panel.js';
import { whatIfReport, whatIfSettings } from './whatif.js';
import { download } from './download.js';

const $ = (id) => document.getElementById(id);

// ---- the workers, as promises (workers.js)
const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
const ask = connect(worker, (m) => {
  if (m.type === 'progress') return showProgress(m.phase, m.fraction);
  if (m.type === 'firstImage') return timeline.acceptFirstImage(m);
  if (m.type === 'preview') return showPreview(m);
}, (reason) => showError(`the page's worker failed: ${reason}`));

// ---- status: progress and errors
function showProgress(phase, fraction) {
  const percent = Math.round(Math.min(1, Math.max(0, fraction)) * 100);
  const bar = $('progress');
  bar.hidden = false;
  bar.setAttribute('aria-valuenow', String(percent));
  bar.setAttribute('aria-valuetext', `${phase}: ${percent}%`);
  $('progress-fill').style.width = `${percent}%`;
  $('progress-text').textContent = phase;
}
function hideProgress() { $('progress').hidden = true; }
function showError(message, headline = 'Something went wrong.') {
  hideProgress();
  $('error-headline').textContent = headline;
  $('error-text').textContent = message;
  $('error').hidden = false;
}
function clearError() { $('error').hidden = true; }
$('error-close').onclick = clearError;

// Said to screen readers (a polite live region): what the keyboard did on the timeline.
function announce(text) {
  $('timeline-status').textContent = text;
}
const keyboardOn = () => document.activeElement === timeline.canvas;
// A band in words, as its tooltip says it (parsed in an inert template).
function bandText(id) {
  const box = document.createElement('template');
  box.innerHTML = timeline.describe(id).replace(/<br>|<div/g, ' $&');
  return box.content.textContent.replace(/\s+/g, ' ').trim();
}

// ---- state
const timeline = new Timeline($('timeline'), $('tooltip'));
// The worker rasterises the timeline on screen (its view id names it); the page hit-tests its
// bands itself (hit.js), so that a hover never waits for the worker.
timeline.backend = {
  setAxis: (xs) => ask('setAxis', { view: timeline.data.view, xs }),
  raster: (request) => ask('raster', { view: timeline.data.view, ...request }),
  hitTest: ({ pos, bytes, slack }) => Promise.resolve(hitTest(timeline.data.arrays, pos, bytes, slack, (id) => timeline.isHidden(id))),
  stackAt: (pos) => ask('stackAt', { view: timeline.data.view, pos }),
  pieces: (alloc) => ask('pieces', { view: timeline.data.view, alloc }),
};
timeline.rangeLabel = $('view-range');
// For the browser benchmark and debugging from the console.
const icicle = new Icicle($('icicle'), $('icicle-tooltip'));
// `doctorApart`: from what size files are diagnosed in the doctor's own worker (tests lower it).
window.__tensormem = { timeline, icicle, ask: (type, payload) => ask(type, payload), doctorApart: DOCTOR_APART };
// The trace on screen: its worker id, name, devices and scenario run ({trace, name, devices, run}),
// and the device shown. Set only once a trace's timeline has been laid out and drawn.
let current = null;
let device = 0;
let loadTicket = 0;
// Loads started (a device shown anew is not one): a doctor's copy of an older one is not wanted.
let loadsStarted = 0;
let scenarios = null;
// The scenarios panel (scenarios-panel.js): runScenario, showRun, showRequestInScenarios.
let panel = null;

// An allocation's frames from one of the timeline's frame tables (innermost first): its stack,
// or its nn.Module scope (the lines that called each module, then the line that allocated; see
// module_scope in src/timeline/mod.rs).
function framesOf(id, offsets, table) {
  const { arrays: a, meta } = timeline.data;
  const s = a.allocStack[id];
  if (s === 0xffffffff) return [];
  const frames = [];
  for (let k = offsets[s]; k < offsets[s + 1]; k++) frames.push(meta.frames[table[k]]);
  return frames;
}
const stackOf = (id) => framesOf(id, timeline.data.arrays.stackOffsets, timeline.data.arrays.stackFrames);
const scopeOf = (id) => framesOf(id, timeline.data.arrays.scopeOffsets, timeline.data.arrays.scopeFrames);
// A Python line as file:line; tensormem's module path frame (no file) by its name.
const scopeText = (frames) => frames.map((f) => (f[1] ? `${f[1].split('/').pop()}:${f[2]}` : f[0])).reverse().join(' › ');
const isPython = (f) => f[1].endsWith('.py');
// Position 0 is the state when the trace starts; position p the state after event p - 1.
const after = (position) => (position === 0 ? 'at the start of the trace' : `after event ${position - 1}`);
const frameText = (f) => (f[1] && f[1] !== '??' ? `${f[0]}  ${f[1]}:${f[2]}` : f[0]);

function lifetime(id) {
  const a = timeline.data.arrays;
  const end = a.allocEnd[id] >= timeline.positions ? 'still live at the end' : `freed at event ${a.allocEnd[id] - 1}`;
  const start = a.allocStart[id] === 0 ? 'live when the trace starts' : `allocated at event ${a.allocStart[id] - 1}`;
  return `${start}, ${end}`;
}

// What the bands can be coloured by (the worker's `colorBy.options`), as the control names them.
const COLOR_BY = { recorded: 'category (recorded)', inferred: 'category (inferred)', frame: 'stack frame' };
const coloredBy = () => timeline.data.colorBy.by;

// An allocation's inferred category ({category, confidence, reason}: the doctor's inference, made
// in the worker), or null where the trace has none inferred (its own categories colour it).
function inferredOf(id) {
  const inferred = timeline.data.inferred;
  if (!inferred) return null;
  return {
    category: inferred.categories[inferred.category[id]],
    confidence: inferred.confidences[inferred.confidence[id]],
    reason: inferred.reasons[inferred.reason[id]],
  };
}
const categoryLabel = (key) => key.replace(/_/g, ' ');

timeline.describe = (id) => {
  const { arrays: a, meta } = timeline.data;
  const frames = stackOf(id);
  const shown = (frames.some(isPython) ? frames.filter(isPython) : frames).slice(0, 5);
  const scope = scopeOf(id);
  const inferred = inferredOf(id);
  const sure = inferred ? ` <span class="muted">(inferred, ${inferred.confidence} confidence)</span>` : '';
  const group = coloredBy() === 'inferred' ? `${escape(categoryLabel(inferred.category))}${sure}`
    : escape(meta.groups[a.allocGroup[id]].name) + (inferred ? `<br>category ${escape(categoryLabel(inferred.category))}${sure}` : '');
  return `<b>${formatBytes(a.allocSize[id])}</b> · ${group}<br>`
    + `address 0x${a.allocAddr[id].toString(16)} · stream ${a.allocStream[id]}<br>${lifetime(id)}`
    + (scope.length ? `<br>module scope: ${escape(scopeText(scope))}` : '')
    + (shown.length ? `<div class="frames">${shown.map((f) => escape(frameText(f))).join('<br>')}</div>` : '');
};

const DETAILS_HINT = $('details').innerHTML;
function showDetails(id) {
  if (id == null) {
    $('details').innerHTML = DETAILS_HINT;
    return;
  }
  const { arrays: a, meta } = timeline.data;
  const frames = stackOf(id);
  const group = meta.groups[a.allocGroup[id]];
  // The inferred category says how sure, and on what it rests; the group (a recorded category
  // or a frame) is shown when it is what colours the band.
  const inferred = inferredOf(id);
  const inferredRow = inferred
    ? `<dt>category (inferred)</dt><dd data-testid="inferred-category" data-category="${escape(inferred.category)}" data-confidence="${inferred.confidence}">`
      + `<b>${escape(categoryLabel(inferred.category))}</b> · ${inferred.confidence} confidence<br><span class="muted">${escape(inferred.reason)}</span></dd>`
    : '';
  const groupRow = coloredBy() === 'inferred' ? '' : `<dt>${group.category ? 'category' : 'group'}</dt><dd>${escape(group.name)}</dd>`;
  $('details').innerHTML = `<dl class="kv">
      <dt>size</dt><dd>${formatBytes(a.allocSize[id])} (${a.allocSize[id].toLocaleString('en-US')} bytes requested)</dd>
      <dt>address</dt><dd>0x${a.allocAddr[id].toString(16)}</dd>
      <dt>stream</dt><dd>${a.allocStream[id]}</dd>
      <dt>lifetime</dt><dd>${lifetime(id)}</dd>
      ${inferredRow}${groupRow}
      <dt>module scope</dt><dd>${scopeOf(id).length ? escape(scopeText(scopeOf(id))) : '<span class="muted">inside no module</span>'}</dd>
    </dl>`
    + stackHtml(frames);
}

// The user's Python frames first; the C++ frames (the same dispatcher plumbing in every PyTorch
// stack) folded below them.
function stackHtml(frames) {
  if (!frames.length) return '<p class="muted">No stack was recorded for this block.</p>';
  const python = frames.filter(isPython);
  const cpp = frames.filter((f) => !isPython(f));
  const lines = (list, cls) => list.map((f) => `<div class="${cls}">${escape(frameText(f))}</div>`).join('');
  if (!python.length) return `<div class="stack">${lines(cpp, 'py')}</div>`;
  return `<div class="stack">${lines(python, 'py')}</div>`
    + (cpp.length ? `<details class="cpp-frames"><summary>${cpp.length} C++ frames</summary><div class="stack">${lines(cpp, 'cpp')}</div></details>` : '');
}

function showLive(position, withState = true) {
  const { arrays: a, meta } = timeline.data;
  const live = [];
  const byGroup = new Map();
  let hiddenCount = 0;
  let hiddenBytes = 0;
  for (let i = 0; i < a.allocSize.length; i++) {
    if (a.allocStart[i] > position || a.allocEnd[i] <= position) continue;
    const g = a.allocGroup[i];
    if (timeline.isHidden(i)) { hiddenCount++; hiddenBytes += a.allocSize[i]; continue; }
    live.push(i);
    byGroup.set(g, (byGroup.get(g) || 0) + a.allocSize[i]);
  }
  live.sort((x, y) => a.allocSize[y] - a.allocSize[x]);
  // By stack (Python frames or all), or by module scope: the tree's levels are then the lines
  // that called each nn.Module, down to the line that allocated.
  const by = $('icicle-by').value;
  icicle.setTree(buildTree(live.map((i) => ({
    bytes: a.allocSize[i], frames: by === 'module' ? scopeOf(i) : stackOf(i), group: meta.groups[a.allocGroup[i]].name, color: timeline.groupColor[a.allocGroup[i]],
  })), by === 'python'));
  $('icicle-title').textContent = `What is live ${after(position)}, by ${by === 'module' ? 'module scope' : 'stack'}`;
  const total = a.allocated[position];
  $('live-title').textContent = `Live ${after(position)}${position === meta.summary.peak_x ? ' (the peak)' : ''}: ${formatBytes(total)} in ${live.length + hiddenCount} allocations`;
  const groups = [...byGroup.entries()].sort((x, y) => y[1] - x[1]).slice(0, 8);
  const max = groups.length ? groups[0][1] : 1;
  const groupRows = groups.map(([g, bytes]) => `<tr><td class="bar-cell"><i style="width:${(100 * bytes) / max}%"></i><span>${escape(meta.groups[g].name)}</span></td><td class="num">${formatBytes(bytes)}</td></tr>`).join('');
  const rows = live.slice(0, 10).map((i) => `<tr class="clickable" data-alloc="${i}"><td class="num">${formatBytes(a.allocSize[i])}</td><td>${escape(meta.groups[a.allocGroup[i]].name)}</td></tr>`).join('');
  const heading = { recorded: 'by category', inferred: 'by category (inferred)', frame: 'by where it was allocated' }[coloredBy()];
  $('live').innerHTML = `<table><tr><th>${heading}</th><th class="num">bytes</th></tr>${groupRows}</table>`
    + `<table style="margin-top:8px"><tr><th class="num">size</th><th>largest allocations</th></tr>${rows}</table>`
    + (hiddenCount ? `<p class="muted">${hiddenCount} allocations live here (${formatBytes(hiddenBytes)}) are hidden by the filter or the legend.</p>` : '');
  for (const tr of $('live').querySelectorAll('tr[data-alloc]')) {
    tr.onclick = () => { timeline.pinned = Number(tr.dataset.alloc); showDetails(timeline.pinned); timeline.requestDraw(); };
  }
  if (withState) showState(position);
  $('cursor-label').textContent = after(position);
  $('cursor-allocated').textContent = formatBytes(total);
  $('cursor-reserved').textContent = `allocated · ${formatBytes(a.reserved[position])} reserved`;
}

// The allocator's segments and blocks at the cursor (replayed in the worker up to it). Only the
// latest request is drawn when the user clicks faster than the replay.
let stateRequest = 0;
let lastState = { key: null, state: null };
async function showState(position) {
  const ticket = ++stateRequest;
  const key = `${current.trace}:${device}:${position}`;
  let state = lastState.key === key ? lastState.state : null;
  try {
    state ||= await ask('stateAt', { trace: current.trace, device, position });
    lastState = { key, state };
  } catch (e) {
    if (ticket !== stateRequest) return;
    $('state-figures').textContent = `The allocator state could not be rebuilt here: ${e.message}`;
    $('segments').getContext('2d').clearRect(0, 0, $('segments').width, $('segments').height);
    $('summary').textContent = '';
    return;
  }
  if (ticket !== stateRequest) return;
  const { arrays: a } = timeline.data;
  const colors = new Map();
  for (let i = 0; i < a.allocSize.length; i++) {
    if (a.allocStart[i] <= position && position < a.allocEnd[i]) colors.set(a.allocAddr[i], timeline.groupColor[a.allocGroup[i]]);
  }
  $('state-title').textContent = `Allocator state ${after(state.events_replayed)}`;
  $('state-figures').innerHTML = describeState(state);
  const colorOf = (address) => colors.get(address) || UNKNOWN;
  showPoolFilter(state, () => drawSegments($('segments'), state, colorOf, $('pool-filter').value || null));
  drawSegments($('segments'), state, colorOf, $('pool-filter').value || null);
  $('summary').textContent = state.memory_summary;
}

// Where private pools hold segments, a choice of which pool's segments to draw (all by default).
function showPoolFilter(state, redraw) {
  const pools = privatePools(state);
  const select = $('pool-filter');
  const chosen = select.value;
  $('pool-filter-label').hidden = pools.length === 0;
  const options = [['', 'every pool'], [DEFAULT_POOL, 'the default pool'], ...pools.map((p) => [p.pool, `pool (${p.pool})`])];
  select.innerHTML = options.map(([value, text]) => `<option value="${value}">${text}</option>`).join('');
  select.value = options.some(([value]) => value === chosen) ? chosen : '';
  select.onchange = redraw;
}

// What the legend's groups are: the caption before them.
const LEGEND_CAPTION = {
  recorded: ['category (recorded)', 'the categories the trace records'],
  inferred: ['category (inferred)', 'inferred by the doctor from each allocation\'s stack, phase and lifetime; hover a band or pin it for how sure'],
  frame: ['stack frame', 'the line of your code at the top of each allocation\'s stack'],
};

function showLegend() {
  const { meta } = timeline.data;
  const shown = Array.from(timeline.groupOrder.slice(0, 24));
  // A category (what the memory is for) reads differently from a frame (where it was made).
  const label = (group) => group.category ? `<b class="category">${escape(group.name)}</b>` : escape(group.name);
  const atPeak = (bytes) => bytes ? `${formatBytes(bytes)} at peak` : 'none at peak';
  const [caption, about] = LEGEND_CAPTION[coloredBy()];
  $('legend').innerHTML = `<span class="legend-caption" data-testid="legend-caption" title="${escape(about)}">${caption}:</span>`
    + shown.map((g) => `<button data-group="${g}" data-kind="${escape(meta.groups[g].kind)}" data-category="${meta.groups[g].category}" data-bytes="${meta.groups[g].bytes_at_peak}" `
    + `data-allocations="${meta.groups[g].allocations}" class="${timeline.hidden.has(g) ? 'off' : ''}" title="click to hide or show">`
    + `<i style="background:${timeline.groupColor[g]}"></i>${label(meta.groups[g])} <span class="count">${atPeak(meta.groups[g].bytes_at_peak)} · ${meta.groups[g].allocations} allocs</span></button>`).join('')
    + (timeline.groupOrder.length > shown.length ? `<span class="count">and ${timeline.groupOrder.length - shown.length} smaller groups</span>` : '');
  for (const b of $('legend').querySelectorAll('button')) {
    b.onclick = () => { timeline.toggleGroup(Number(b.dataset.group)); showLegend(); showLive(timeline.cursor); };
  }
}

// A timeline's summary (meta.summary) in the figures above it, and its warnings.
function showSummary(s) {
  setPeak($('peak-allocated'), s.peak_allocated_bytes);
  setPeak($('peak-reserved'), s.peak_reserved_bytes);
  $('trace-events').textContent = `${s.events.toLocaleString('en-US')} events · ${s.allocations.toLocaleString('en-US')} allocations`;
  $('trace-settings').textContent = `device ${s.device} · settings ${s.settings}${s.time_source ? ` · time ${s.time_source}` : ''}`;
  $('warnings').innerHTML = s.warnings.map((w) => `<li>${escape(w)}</li>`).join('');
}

function setPeak(el, bytes) {
  el.dataset.bytes = String(bytes);
  el.textContent = formatBytes(bytes);
  el.title = `${bytes.toLocaleString('en-US')} bytes`;
}

// Lays out and draws one device of a trace. `ticket` (a load's number) makes a stale answer a
// no-op: the newest load always wins. `colorBy`: what colours the bands (null: the trace's
// default, its recorded categories or else the inferred ones).
async function showDevice(info, d, ticket = loadTicket, colorBy = null) {
  // By event index, the worker draws the first image with the layout (one round trip less); for
  // a long trace, from bands laid out for that image alone (see worker.js).
  const p = timeline.plot;
  const dpr = window.devicePixelRatio || 1;
  const first = $('axis-select').value === 'event' ? { width: Math.round(p.w * dpr), height: Math.round(p.h * dpr), alone: FIRST_IMAGE_ALONE } : null;
  const data = await ask('timeline', { trace: info.trace, device: d, first, colorBy });
  if (ticket !== loadTicket) return false;
  // The trace's own grouping, which a comparison attributes by, whatever colours the bands.
  data.baseGroups = data.meta.base_groups || data.meta.groups;
  performance.mark('tensormem:timeline-received');
  hideProgress();
  previewOf = null;
  current = info;
  device = d;
  const s = data.meta.summary;
  showSummary(s);
  $('axis-select').querySelector('option[value=time]').disabled = !s.has_time;
  timeline.axis = $('axis-select').value;
  const painted = timeline.setData(data, first);
  $('axis-select').value = timeline.axis;
  $('color-by').replaceChildren(...data.colorBy.options.map((o) => new Option(COLOR_BY[o], o, false, o === data.colorBy.by)));
  resetFilters(data);
  if ($('filter-text').value || $('filter-min').value || $('filter-max').value || $('filter-range').checked) await updateFilter();
  showLegend();
  showDetails(null);
  $('whatif-result').innerHTML = '';
  $('replay-key').hidden = true;
  $('compare-result').innerHTML = '';
  $('export-other').hidden = true;
  clearDiagnosis();
  const diagnosis = diagnosisTicket;
  // What is live at the cursor (the peak) and the allocator state there (replayed in the
  // worker), then the doctor's findings: after the first paint, which does not wait for them.
  info.painted = painted;
  painted.then(async () => {
    performance.mark('tensormem:painted');
    if (current === info) showLive(timeline.cursor);
    // The full layout is asked for once the diagnosis is (a file read back from its kept decode
    // is diagnosed once it is hashed again), so that the page's worker gives the findings first.
    await diagnoseOnceSame(info, d, diagnosis);
    if (data.bandsForFirstImage) layFullBands(data);
  });
  return true;
}

// A trace this long (events) has its first image drawn before its bands are laid out fully;
// `?first-image-alone=N` sets another length (the page's tests use it on short traces).
const FIRST_IMAGE_ALONE = Number(new URLSearchParams(location.search).get('first-image-alone') ?? 1 << 20);

// The full layout of the bands of `data` (a view drawn from bands laid out for its first image):
// the hover, zoom and image then use it. Kept in `data` even while it is not on screen (a preview
// of a file opened again may be), since the worker's view has it from then on.
async function layFullBands(data) {
  let full;
  try {
    full = await ask('fullBands', { view: data.view });
  } catch (e) {
    if (!/no longer shown/.test(e.message)) showError(`The bands could not be laid out fully: ${e.message}`);
    return;
  }
  if (!full) return;
  data.bandsForFirstImage = false;
  data.meta.summary.warnings = full.warnings;
  timeline.setPieces(data, full.arrays);
  if (timeline.data === data) showSummary(data.meta.summary);
  performance.mark('tensormem:full-bands');
}

// Diagnoses device `d` of `info` unless the diagnosis `ticket` is stale by then; a trace read back
// before its file was hashed, once the hash says it is the same.
async function diagnoseOnceSame(info, d, ticket) {
  if (info.reopened && !(await sameBytes(info))) return;
  if (ticket === diagnosisTicket) diagnose(info, d, ticket);
}

// Whether a trace read back from a kept decode is of its file's bytes, hashed by the worker once
// the trace is drawn; if not, the file is opened again (parsed).
// If a newer load is running, that load reopens it when it ends without replacing it.
function sameBytes(info) {
  info.sameBytes ??= ask('sameBytes', { trace: info.trace }).catch(() => true).then((same) => {
    if (!same && info.reload) {
      info.changed = true;
      announce(`${info.name} changed since the decode kept of it: reading it again`);
      if (current === info && !(newestLoad.running && newestLoad.ticket !== info.ticket)) info.reload();
    }
    return same;
  });
  return info.sameBytes;
}

// ---- a file opened again: the view the page kept of it, shown until its timeline is laid out.
// The load (by ticket) it shows, while shown.
let previewOf = null;
// The last load that showed a preview (its view is not kept again).
let previewed = 0;
// The newest load started ({ticket, running}).
let newestLoad = { ticket: 0, running: false };

// The worker's 'preview' ({ticket, image: {width, height, pixels}, summary}): the timeline's
// image as drawn when the same file was last opened, with its peaks, put on screen before the
// kept decode is read back.
// It comes before the load's answer (the worker posts it first), so never after its timeline.
function showPreview({ ticket, image, summary }) {
  if (ticket !== loadTicket) return;
  previewOf = ticket;
  previewed = ticket;
  timeline.showPreview(new ImageData(image.pixels, image.width, image.height));
  showSummary(summary);
  $('cursor-label').textContent = 'at the cursor';
  $('cursor-allocated').textContent = '–';
  $('cursor-reserved').textContent = '';
  $('legend').replaceChildren();
  showDetails(null);
  clearDiagnosis();
  $('diagnosis-status').textContent = 'as last opened: the trace is being read back…';
  performance.mark('tensormem:preview');
}

// A preview whose load failed: the trace shown before comes back, diagnosed again.
function withdrawPreview() {
  if (previewOf === null) return;
  previewOf = null;
  timeline.clearPreview();
  if (!current || !timeline.data) return;
  showSummary(timeline.data.meta.summary);
  showLive(timeline.cursor);
  showLegend();
  clearDiagnosis();
  diagnoseOnceSame(current, device, diagnosisTicket);
}

// Keeps the decode of `info` and, `withImage`, what the page shows of it (the timeline's pixels,
// its peaks) for a preview when the file is opened again. Raw pixels, not an encoded image: a
// few MB, and no image codec to wait for.
function keepView(info, withImage) {
  if (current !== info) return;
  let view = {};
  if (withImage && timeline.data) {
    const { width, height } = timeline.canvas;
    view = { image: { width, height, pixels: timeline.ctx.getImageData(0, 0, width, height).data }, summary: timeline.data.meta.summary };
  }
  ask('keepView', { trace: info.trace, ...view }).then(() => performance.mark('tensormem:kept'), () => {});
}

// ---- diagnosis: the doctor's findings on the device shown (computed in the worker after the
// first paint), as cards above the timeline; the scenario panel gets its verdict.
let diagnosisTicket = 0;

// No findings until the doctor has read the device now shown (an answer still coming for the
// one before is dropped by its ticket).
function clearDiagnosis() {
  ++diagnosisTicket;
  $('findings').replaceChildren();
  $('diagnosis').dataset.state = 'pending';
  $('diagnosis-status').textContent = 'the doctor reads the trace once it is drawn…';
}
async function diagnose(info, d, ticket) {
  $('diagnosis-status').textContent = 'the doctor is reading the trace…';
  let out;
  try {
    out = await findingsOf(info, d, ask);
  } catch (e) {
    if (ticket !== diagnosisTicket) return;
    $('diagnosis').dataset.state = 'failed';
    $('diagnosis-status').textContent = `The doctor could not read this trace: ${e.message}`;
    return;
  }
  if (ticket !== diagnosisTicket) return;
  const shown = showFindings($('findings'), out.findings, { go: goToFinding, fix: showFix }, out.notes || []);
  const problems = shown.filter(isProblem).length;
  $('diagnosis-status').textContent = problems ? `${problems} problem${problems > 1 ? 's' : ''} found, device ${d}` : `no problem found beyond the peak, device ${d}`;
  $('diagnosis').dataset.state = 'ready';
  $('diagnosis').dataset.apart = String(Boolean(out.apart));
  performance.mark('tensormem:diagnosed');
  if (info.run) await showVerdict(info, out.findings, ticket);
}

// A finding on the timeline: the cursor at its moment, its allocations outlined, the largest
// pinned (its stack in the details panel).
function goToFinding(f, card) {
  if (!timeline.data) return;
  const ids = allocationsOf(f, timeline.data.arrays);
  timeline.setHighlight(ids);
  for (const c of $('findings').children) c.classList.toggle('active', c === card);
  const position = momentOf(f);
  if (position != null) timeline.moveCursor(position);
  timeline.pin(ids.length ? ids[0] : null);
  const where = position == null ? '' : ` Cursor ${after(position)}.`;
  announce(`${f.title}.${where}${ids.length ? ` ${ids.length} allocation${ids.length > 1 ? 's' : ''} outlined; the largest pinned.` : ''}`);
}

// A finding's verified fix, drawn beside the recorded curve: the What if panel's replay, run with
// the settings, capacity and start the doctor measured.
async function showFix(f, card) {
  const v = f.verified;
  $('whatif-conf').value = v.alloc_conf;
  $('whatif-capacity').value = v.capacity == null ? '' : String(v.capacity);
  $('whatif-start').value = v.start;
  let line = card.querySelector('.finding-fixed');
  if (!line) {
    line = document.createElement('p');
    line.className = 'finding-fixed';
    card.querySelector('.finding-row').after(line);
  }
  line.textContent = `Replaying: ${verifiedText(v)}…`;
  const r = await runWhatIf();
  if (!r) { line.textContent = 'The what-if replay failed (see above).'; return; }
  line.textContent = `The what-if reserved curve (dark, dashed) is drawn beside the recorded one: ${verifiedText(v)}`
    + (v.command ? '' : ' (the doctor replayed the trace edited as it says; the curve shown replays the file itself, unedited)')
    + `. Replayed here: peak reserved ${formatBytes(r.replayed.peak_reserved_bytes)}${r.replayed.ooms || r.out_of_memory_at_start ? ', out of memory' : ''}.`;
}

// The scenario panel's verdict: the doctor on this run, and on the scenario's other variant (run
// in the worker on the same card; not for runs on this browser's GPU).
async function showVerdict(info, findings, ticket) {
  const run = JSON.parse(info.run);
  const s = scenarios?.scenarios.find((x) => x.name === run.scenario);
  const variants = s ? s.variants : [];
  const variant = run.variant || info.request?.variant || variants[0] || 'this run';
  const rows = new Map([[variant, verdictRow(variant, findings)]]);
  const show = () => {
    const order = [...variants.filter((v) => rows.has(v)), ...[...rows.keys()].filter((v) => !variants.includes(v))];
    $('verdict-list').replaceChildren(...order.map((v) => rows.get(v)));
    $('scenario-verdict').hidden = false;
  };
  show();
  const other = variants.find((v) => v !== variant);
  if (!other || !info.request || info.request.device === 'gpu') return;
  try {
    const out = await ask('diagnoseScenario', { request: { ...info.request, variant: other } });
    if (ticket !== diagnosisTicket) return;
    rows.set(other, verdictRow(other, out.findings));
    show();
  } catch (e) {
    if (ticket === diagnosisTicket) rows.set(other, Object.assign(document.createElement('li'), { textContent: `${other}: could not run (${e.message})` }));
    show();
  }
}

// Closes a trace the page gave up on, in both workers.
function drop(info) {
  ask('drop', { trace: info.trace });
  dropDoctor(info);
}

// Opens a trace (a file, a URL or a scenario run) in the worker and shows it; the previous trace
// stays on screen, and usable, until the new one is drawn.
async function load(request, payload) {
  performance.mark('tensormem:file-chosen');
  const ticket = ++loadTicket;
  newestLoad = { ticket, running: true };
  clearError();
  showProgress('starting', 0);
  let info = null;
  try {
    // A large file is opened by the doctor's worker too, at once (see DOCTOR_APART). Its copy
    // of the trace on screen goes first (the other devices are then diagnosed by the page's worker).
    const apart = request === 'openFile' && doctorApart(payload.file);
    const number = ++loadsStarted;
    const wanted = () => number === loadsStarted;
    if (apart) dropDoctor(current);
    const doctor = apart ? openForDoctor(payload.file, wanted) : null;
    try {
      info = await ask(request, request === 'openFile' ? { ...payload, ticket } : payload);
    } catch (e) {
      dropDoctor({ doctor });
      throw e;
    }
    info.doctor = doctor;
    if (request === 'runScenario') info.request = payload.request;
    // Read back before the file was hashed (once painted: see sameBytes): opened again if the
    // hash says it changed.
    info.ticket = ticket;
    if (info.reopened) {
      info.reload = () => {
        info.reload = null; // once: a file that cannot be read again stays as shown, with the error
        load(request, payload);
      };
    }
    performance.mark('tensormem:parsed');
    if (ticket !== loadTicket) return void drop(info);
    if (!info.devices.length) throw new Error('the snapshot has no segments and no trace for any device');
    const previous = current;
    // The device the doctor picks: the one that ran out of memory, else the one that reserved the most.
    const shown = info.devices.includes(info.defaultDevice) ? info.defaultDevice : info.devices[0];
    if (!(await showDevice(info, shown, ticket))) return void drop(info);
    // Its decode is kept, and its view as first drawn (unless this open showed the view kept
    // before). Asked once painted, after the doctor: the page's worker, diagnosing, was asked
    // first, and keeping a 1 GB file's decode takes it seconds the findings do not wait for.
    if (info.keeps) info.painted.then(() => keepView(info, previewed !== ticket));
    $('source-name').textContent = info.name;
    // A file opened before is read back from the decode this browser kept of it (same bytes).
    $('source-name').title = info.reopened ? `${info.name}: read back from the decode this browser kept when the same file was last opened` : info.name;
    $('source-name').dataset.reopened = String(Boolean(info.reopened));
    $('device-select').innerHTML = info.devices.map((d, k) => `<option value="${d}">${escape(info.deviceLabels[k])}</option>`).join('');
    $('device-select').value = String(shown);
    $('device-box').hidden = info.devices.length < 2;
    if (info.run) panel?.showRun(JSON.parse(info.run));
    await ask('use', { trace: info.trace, previous: previous?.trace });
    if (previous !== info) dropDoctor(previous);
  } catch (e) {
    if (info && current !== info) drop(info);
    const name = payload.file?.name || payload.url?.split('/').pop();
    const still = current ? ` Still showing ${current.name}.` : '';
    if (ticket === loadTicket) showError(e.message, request === 'runScenario' ? `The scenario could not run.${still}` : `Could not load ${name || 'this file'}.${still}`);
  } finally {
    if (ticket === loadTicket) hideProgress();
    // A preview this load showed and did not replace (it failed, or a newer load won).
    if (previewOf === ticket) withdrawPreview();
    if (newestLoad.ticket === ticket) {
      newestLoad.running = false;
      // The trace on screen was found changed while this load ran, and this one did not replace it.
      if (current?.changed && current.reload) current.reload();
    }
  }
}

// ---- inputs
$('open-file').addEventListener('change', (e) => {
  const file = e.target.files[0];
  if (file) load('openFile', { file });
  e.target.value = '';
});
$('device-select').addEventListener('change', (e) => {
  // The findings shown are the previous device's: withdrawn at once, not when the new device's
  // timeline arrives (seconds on a large trace).
  clearDiagnosis();
  showDevice(current, Number(e.target.value), ++loadTicket, timeline.data?.colorBy.by).catch((err) => {
    showError(err.message, 'Could not show this device.');
    $('diagnosis').dataset.state = 'failed';
    $('diagnosis-status').textContent = `The doctor has no timeline of device ${e.target.value} to read.`;
  });
});
// Colour by the trace's own categories, the inferred ones or the stack frame: the worker regroups
// the bands (inferring the categories the first time); the legend, the panels and the image follow.
$('color-by').addEventListener('change', async (e) => {
  const data = timeline.data;
  if (!data) return;
  const by = e.target.value;
  try {
    const out = await ask('colorBy', { view: data.view, by, withInferred: !data.inferred });
    if (data !== timeline.data) return;
    if (out.inferred) data.inferred = out.inferred;
    data.colorBy.by = by;
    timeline.setGrouping(out.allocGroup, out.groups);
    showLegend();
    showDetails(timeline.pinned);
    // A filter matches category names: it is applied again to the new groups.
    if ($('filter-text').value) await updateFilter(); else showLive(timeline.cursor);
    if (keyboardOn()) announce(`Coloured by ${COLOR_BY[by]}.`);
  } catch (err) {
    if (data === timeline.data) showError(err.message, 'The timeline could not be coloured that way.');
  }
});
$('axis-select').addEventListener('change', (e) => timeline.setAxis(e.target.value));
let dragDepth = 0;
window.addEventListener('dragenter', (e) => { e.preventDefault(); dragDepth++; $('drop').hidden = false; });
window.addEventListener('dragleave', () => { if (--dragDepth <= 0) { dragDepth = 0; $('drop').hidden = true; } });
window.addEventListener('dragover', (e) => e.preventDefault());
window.addEventListener('drop', (e) => {
  e.preventDefault();
  dragDepth = 0;
  $('drop').hidden = true;
  const file = e.dataTransfer.files[0];
  if (file) load('openFile', { file });
});
timeline.on('cursor', (position) => {
  showLive(position);
  if (keyboardOn()) announce(`Cursor ${after(position)}: ${$('cursor-allocated').textContent} allocated, ${formatBytes(timeline.data.arrays.reserved[position])} reserved.`);
});
timeline.on('pin', (id) => {
  showDetails(id);
  if (keyboardOn()) announce(id == null ? 'Unpinned.' : `Pinned: ${bandText(id)}`);
});
timeline.on('select', (id) => {
  if (id != null && keyboardOn()) announce(bandText(id));
});
timeline.on('error', (e) => showError(e.message, 'The timeline could not be drawn.'));
// A finding's outlines cleared (Escape on the timeline): its card is no longer the active one.
timeline.on('highlight', (ids) => {
  if (!ids.length) for (const c of $('findings').children) c.classList.remove('active');
});

$('icicle-by').addEventListener('change', () => showLive(timeline.cursor));

// ---- search and filter
let filterTicket = 0;
async function sizeOf(input) {
  const text = input.value.trim();
  input.classList.remove('bad');
  if (!text) return null;
  try {
    return await ask('parseSize', { text });
  } catch (e) {
    input.classList.add('bad');
    input.title = e.message;
    return null;
  }
}
async function updateFilter() {
  if (!timeline.data) return;
  const ticket = ++filterTicket;
  const [min, max] = [await sizeOf($('filter-min')), await sizeOf($('filter-max'))];
  if (ticket !== filterTicket) return;
  const stream = $('filter-stream').value === '' ? null : Number($('filter-stream').value);
  const range = $('filter-range').checked ? [timeline.positionAt(timeline.view[0]), timeline.positionAt(timeline.view[1]) + 1] : null;
  const result = applyFilter({ text: $('filter-text').value, min, max, stream, range }, timeline.data);
  timeline.setMask(result.mask);
  const total = timeline.data.arrays.allocSize.length;
  const count = $('filter-count');
  count.classList.toggle('active', result.hidden > 0);
  count.textContent = result.hidden
    ? `showing ${(total - result.hidden).toLocaleString('en-US')} of ${total.toLocaleString('en-US')} allocations; ${result.hidden.toLocaleString('en-US')} hidden (${formatBytes(result.hiddenBytes)})`
    : `${total.toLocaleString('en-US')} allocations`;
  showLive(timeline.cursor);
}
let filterTimer;
for (const id of ['filter-text', 'filter-min', 'filter-max']) {
  $(id).addEventListener('input', () => { clearTimeout(filterTimer); filterTimer = setTimeout(updateFilter, 200); });
}
$('filter-stream').addEventListener('change', updateFilter);
$('filter-range').addEventListener('change', updateFilter);

function resetFilters(data) {
  $('filter-stream').innerHTML = '<option value="">all streams</option>' + streamsOf(data).map((s) => `<option value="${s}">stream ${s}</option>`).join('');
  $('filter-count').textContent = `${data.arrays.allocSize.length.toLocaleString('en-US')} allocations`;
  $('filter-count').classList.remove('active');
}

// ---- export
async function exportTrace(format) {
  if (!current) return;
  try {
    download(await ask('exportTrace', { trace: current.trace, format }), current.name, format);
  } catch (e) {
    showError(e.message, 'Export failed.');
  }
}
$('export-pickle').onclick = () => exportTrace('pickle');
$('export-json').onclick = () => exportTrace('json');

// ---- compare
let compared = null;
// Only the newest comparison of the trace still on screen is shown.
let compareTicket = 0;
async function compare(request, payload) {
  if (!current || !timeline.data) return;
  clearError();
  const ticket = ++compareTicket;
  const data = timeline.data;
  try {
    const answer = await ask(request, { trace: current.trace, device, ...payload });
    if (ticket !== compareTicket || data !== timeline.data) return;
    compared = answer;
    const meta = { ...timeline.data.meta, groups: timeline.data.baseGroups };
    showComparison($('compare-result'), { name: current.name, meta, arrays: timeline.data.arrays }, compared);
    $('export-other').hidden = request !== 'compareWhatIf';
  } catch (e) {
    if (ticket === compareTicket) showError(e.message, 'The comparison failed.');
  } finally {
    if (ticket === compareTicket) hideProgress();
  }
}
$('compare-file').addEventListener('change', (e) => {
  const file = e.target.files[0];
  if (file) compare('compareFile', { file });
  e.target.value = '';
});
$('compare-whatif').onclick = () => compare('compareWhatIf', whatIfSettings());
$('export-other').onclick = async () => {
  try {
    download(await ask('exportOther', { format: 'pickle' }), compared ? compared.name : 'what-if', 'pickle');
  } catch (e) {
    showError(e.message, 'Export failed.');
  }
};

// ---- what if
// Replays the trace on screen with the panel's settings and draws both reserved curves; returns
// the replay's figures, or null when it failed.
async function runWhatIf() {
  if (!current) return null;
  clearError();
  $('whatif-run').disabled = true;
  try {
    const out = await ask('replay', { trace: current.trace, device, ...whatIfSettings() });
    const { html, oomPosition } = whatIfReport(out);
    timeline.setReplay({ reserved_curve: out.reserved_curve, oomPosition });
    $('replay-key').hidden = false;
    $('whatif-result').innerHTML = html;
    return out.replay;
  } catch (e) {
    showError(e.message, 'The what-if replay failed.');
    return null;
  } finally {
    $('whatif-run').disabled = false;
    hideProgress();
  }
}
$('whatif-run').onclick = runWhatIf;

// ---- start: a snapshot named in the URL (tensormem serve FILE), else the default scenario
async function start() {
  try {
    panel = await setUpScenarios({ ask, load });
    scenarios = panel.scenarios;
    setUpFits({ ask, load, presets: scenarios.presets, showProgress, hideProgress, download });
    setUpSize({ ask, load, scenarios, showProgress, hideProgress, showRequestInScenarios: panel.showRequestInScenarios });
  } catch (e) {
    showError(`the page could not start its wasm: ${e.message}`);
    return;
  }
  const file = new URLSearchParams(location.search).get('file');
  if (file) await load('openUrl', { url: file });
  else await panel.runScenario();
}
start();
