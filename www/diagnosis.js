// The Diagnosis panel: the doctor's findings (src/doctor, run in the worker) as compact cards, in
// the doctor's order: the peak summary first, then the problems by bytes at stake, the
// inconclusive ones apart under a heading, what lies outside the allocator last. A finding the
// doctor is less than sure of says so (its confidence, and why). Every text from the wasm side (titles, why, fix, frames) goes in as text
// (textContent), never as markup.
import { formatBytes } from './format.js';

// The trace position a finding is about (0..=events): what was live at its moment (the peak, the
// state just before a failed request), the position a fragmentation finding examined, else the
// event named; a truncated trace is about its start. null when the evidence names none.
export function momentOf(finding) {
  const e = finding.evidence || {};
  if (e.live && Number.isInteger(e.live.position)) return e.live.position;
  if (Number.isInteger(e.position)) return e.position;
  if (Number.isInteger(e.event)) return e.event + 1;
  if (finding.kind === 'truncated-trace') return 0;
  return null;
}

// The allocations a finding names ({trace_index, address, bytes}: what was live at its moment,
// else its own `allocations`, as the training-loop kinds list them), as the timeline's ids: an
// allocation made by the trace's entry `trace_index` at `address`, or one live from the start.
export function allocationsOf(finding, arrays) {
  const named = finding.evidence?.live?.largest || finding.evidence?.allocations || [];
  const ids = [];
  for (const r of named) {
    const start = r.trace_index == null ? 0 : r.trace_index + 1;
    for (let id = 0; id < arrays.allocSize.length; id++) {
      if (arrays.allocStart[id] === start && arrays.allocAddr[id] === r.address) { ids.push(id); break; }
    }
  }
  return ids;
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'dataset') Object.assign(node.dataset, v);
    else if (k === 'text') node.textContent = v;
    else if (v != null) node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c != null));
  return node;
}

// Each finding carries its label (the doctor's registry of kinds, src/doctor/kinds.rs).
const labelOf = (f) => f.label || f.kind;

// Findings that describe rather than accuse: a file without history (`no-history`), the peak
// summary, what it is made of by op when
// nothing is wrong (`intermediates`), and what nvidia-smi shows beyond reserved
// (`outside-allocator`, an estimate, always last).
const INFORMATION = new Set(['no-history', 'peak', 'intermediates', 'outside-allocator']);
export function isProblem(f) {
  return !INFORMATION.has(f.kind) && f.confidence !== 'inconclusive';
}

// "medium confidence: why", "inconclusive: why"; null for a finding the doctor is sure of.
function confidenceText(f) {
  if (!f.confidence || f.confidence === 'high') return null;
  const reason = f.confidence_reason ? `: ${f.confidence_reason}` : '';
  return f.confidence === 'inconclusive' ? `Inconclusive${reason}.` : `Medium confidence${reason}.`;
}

// The verified what-if in one line: "replay with expandable_segments:True: peak reserved 1.2 GiB → 900 MiB".
export function verifiedText(v) {
  const oom = (flag) => (flag ? ', out of memory' : '');
  const allocated = v.before_peak_allocated_bytes === v.after_peak_allocated_bytes ? ''
    : `, peak allocated ${formatBytes(v.before_peak_allocated_bytes)} → ${formatBytes(v.after_peak_allocated_bytes)}`;
  return `${v.how}: peak reserved ${formatBytes(v.before_peak_reserved_bytes)}${oom(v.before_out_of_memory)} → `
    + `${formatBytes(v.after_peak_reserved_bytes)}${oom(v.after_out_of_memory)}${allocated}`;
}

// Whether the What if panel can replay a verification: a file's own trace under other settings
// or on a card of a given size. A replay of an edited trace (tensors freed sooner) it cannot:
// its figures are shown as text instead.
function replayable(v) {
  return Boolean(v.command) || v.capacity != null;
}

// What the evidence says beyond the title, as short lines of text.
function evidenceLines(f) {
  const e = f.evidence || {};
  const lines = [];
  if (e.live) {
    const groups = (e.live.by_group || []).slice(0, 4).map((g) => `${g.name} ${formatBytes(g.bytes)}`).join(', ');
    lines.push(`Live then: ${formatBytes(e.live.bytes)} in ${e.live.allocations} allocations${groups ? ` (${groups})` : ''}.`);
  }
  if (f.kind === 'fragmentation') {
    lines.push(`Reserved ${formatBytes(e.reserved_bytes)}, allocated ${formatBytes(e.allocated_bytes)}: ${formatBytes(e.internal_bytes)} rounding inside blocks, `
      + `${formatBytes(e.external_bytes)} cached free in ${e.free_blocks} blocks (largest ${formatBytes(e.largest_free_block_bytes)}).`);
  }
  if (f.kind === 'oom' && e.smallest_capacity_bytes) {
    lines.push(`Request ${formatBytes(e.request_bytes)} with ${formatBytes(e.reserved_bytes)} reserved; the smallest capacity that fits: ${formatBytes(e.smallest_capacity_bytes)}.`);
  }
  return lines;
}

// Fills `root` (the panel's list) with one card per finding, and the doctor's notes (what the
// trace cannot show) after them. `on.go(finding)` moves the timeline to it, `on.fix(finding)`
// runs its verified what-if.
export function showFindings(root, findings, on, notes = []) {
  root.replaceChildren(...findings.map((f, k) => {
    const moment = momentOf(f);
    const go = el('button', {
      class: 'finding-go',
      type: 'button',
      title: moment == null ? 'Show its details' : `Move the cursor to ${moment === 0 ? 'the start of the trace' : `after event ${moment - 1}`} and show what it names`,
    },
    el('span', { class: `finding-kind kind-${f.kind}`, text: labelOf(f) }),
    f.confidence && f.confidence !== 'high' ? el('span', { class: `finding-confidence confidence-${f.confidence}`, text: f.confidence }) : null,
    el('span', { class: 'finding-title', text: f.title }),
    el('span', { class: 'finding-bytes', text: formatBytes(f.bytes) }));
    go.addEventListener('click', () => on.go(f, card));
    const more = el('div', { class: 'finding-more', id: `finding-more-${k}`, hidden: '' },
      confidenceText(f) ? el('p', { class: 'finding-confidence-reason', text: confidenceText(f) }) : null,
      el('p', { class: 'finding-why', text: f.why }),
      el('p', { class: 'finding-fix' }, el('b', { text: 'Fix: ' }), f.fix),
      ...evidenceLines(f).map((line) => el('p', { class: 'finding-evidence', text: line })),
      ...(f.evidence?.live?.top_stacks || []).slice(0, 3).map((s) => el('div', { class: 'stack' },
        el('div', { class: 'muted', text: `${formatBytes(s.bytes)} in ${s.allocations} allocations from:` }),
        ...s.frames.map((frame) => el('div', { class: 'py', text: frame })))),
      f.estimate ? el('p', { class: 'finding-estimate muted', text: `Estimate: ${f.estimate}` }) : null);
    const fix = f.verified && replayable(f.verified)
      ? el('button', { class: 'button finding-fix-button', type: 'button', 'data-testid': 'show-fix', title: verifiedText(f.verified) }, 'show the fix')
      : null;
    if (fix) fix.addEventListener('click', () => on.fix(f, card));
    // Why, the fix and the evidence: folded under the line.
    const toggle = el('button', { class: 'link finding-toggle', type: 'button', 'aria-expanded': 'false', 'aria-controls': `finding-more-${k}` }, 'why & fix');
    toggle.addEventListener('click', () => {
      more.hidden = !more.hidden;
      toggle.setAttribute('aria-expanded', String(!more.hidden));
    });
    const card = el('li', {
      class: f.confidence === 'inconclusive' ? 'finding inconclusive' : 'finding',
      'data-testid': 'finding',
      dataset: { kind: f.kind, bytes: String(f.bytes), position: moment == null ? '' : String(moment), rank: String(k), confidence: f.confidence || 'high' },
    }, el('div', { class: 'finding-row' }, go, toggle, fix),
    f.verified && !replayable(f.verified) ? el('p', { class: 'finding-fixed', 'data-testid': 'finding-measured', text: `Measured: ${verifiedText(f.verified)}.` }) : null,
    more);
    return card;
  }));
  // The inconclusive findings (after the problems, never ranked among them) under a heading of their own.
  const first = root.querySelector('.finding.inconclusive');
  if (first) first.before(el('li', { class: 'finding-section muted', 'data-testid': 'inconclusive-heading', text: 'Inconclusive: the trace cannot tell' }));
  for (const note of notes) root.append(el('li', { class: 'finding-note muted', 'data-testid': 'diagnosis-note', text: `Note: ${note}` }));
  return findings;
}

// The doctor's verdict on a scenario run, in one line per variant: the kinds found and their titles.
export function verdictRow(label, findings) {
  const problems = findings.filter(isProblem);
  const row = el('li', { dataset: { variant: label, kinds: findings.map((f) => f.kind).join(' ') } },
    el('b', { text: `${label}: ` }),
    problems.length ? `${problems.length} problem${problems.length > 1 ? 's' : ''}` : 'no problem found beyond the peak');
  const list = el('ul');
  for (const f of findings) list.append(el('li', { class: isProblem(f) ? '' : 'muted' }, el('span', { class: `finding-kind kind-${f.kind}`, text: labelOf(f) }), f.confidence && f.confidence !== 'high' ? ` (${f.confidence})` : null, ` ${f.title}`));
  row.append(list);
  return row;
}
