// The colours of the groups (what a band is coloured by), shared by the page and its worker so
// the worker can draw a trace's first image before the page asks: the groups biggest at the
// peak get the distinct colours, the bands without a stack grey.

const PALETTE = [
  '#4e79a7', '#f28e2b', '#59a14f', '#b07aa1', '#76b7b2', '#edc948', '#ff9da7', '#9c755f',
  '#6f9fd8', '#e15759', '#8cd17d', '#d4a6c8', '#86bcb6', '#f1ce63', '#a0cbe8', '#ffbe7d',
];
// Memory whose owner is unknown: no stack, or a block no live allocation explains.
export const UNKNOWN = '#8e96a3';
// Colours by a group's `kind`, the stable key the wasm side gives every group (GroupKind in
// src/timeline/mod.rs); its `name` is for people and is never matched here. The groups without
// a stack are grey. Categories (recorded by tensormem's own traces, or inferred by the doctor for
// PyTorch's, keyed as snapshots write them) keep torch.profiler's memory-timeline colours, so a
// band means the same thing on both plots (its input black, softened here to dark grey); what
// the inference finds of no known category is grey.
const BY_KIND = new Map(Object.entries({
  before_trace: '#b9c0cc', no_stack: UNKNOWN, unknown: UNKNOWN,
  parameter: '#006400', optimizer_state: '#daa520', input: '#3c3c3c', temporary: '#9370db',
  activation: '#ff0000', gradient: '#0000cd', autograd_detail: '#4169e1',
}));
// A category's colour (its key as traces write it: `optimizer_state`), grey for any other.
export function categoryColor(kind) {
  return BY_KIND.get(kind) || UNKNOWN;
}
// The categories bottom up, as stacked charts of a peak draw them.
export const CATEGORY_ORDER = ['parameter', 'gradient', 'optimizer_state', 'activation', 'temporary', 'input', 'autograd_detail', 'unknown'];

// Hidden allocations stay as faint ghosts (#eef0f3), so the picture keeps its shape.
export const GHOST = 0xfff3f0ee;

// groups: the timeline's [{kind, bytes_at_peak}] -> the drawing order, CSS colours, and the same
// colours as RGBA words (red in the low byte) for pixel buffers. Frame groups take the palette's
// colours in turn, biggest at the peak first.
export function colorGroups(groups) {
  const order = groups.map((g, i) => i).sort((x, y) => groups[y].bytes_at_peak - groups[x].bytes_at_peak);
  const colors = new Array(groups.length);
  const pixels = new Uint32Array(groups.length);
  let next = 0;
  for (const g of order) {
    colors[g] = BY_KIND.get(groups[g].kind) || PALETTE[next++ % PALETTE.length];
    const hex = parseInt(colors[g].slice(1), 16);
    pixels[g] = (0xff << 24 | (hex & 0xff) << 16 | (hex >> 8 & 0xff) << 8 | hex >> 16) >>> 0;
  }
  return { order: Uint32Array.from(order), colors, pixels };
}

// Charts leave 6% above their highest value.
export const HEADROOM = 1.06;

// The top of the timeline's y axis: the peaks plus the headroom.
export function topBytes(summary, extra = 0) {
  return Math.max(summary.peak_reserved_bytes, summary.peak_allocated_bytes, extra, 1) * HEADROOM;
}
