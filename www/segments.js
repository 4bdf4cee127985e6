// The allocator's state at the cursor: one row per segment, its blocks drawn to scale inside it
// (allocated blocks in their band's colour with the rounding waste darker at their end, cached
// free blocks light, blocks freed but waiting on another stream yellow), and the figures that
// explain reserved-but-unallocated memory: rounding waste, cached free bytes, the largest free
// block, fragmentation.
import { formatBytes } from './format.js';
import { prepareCanvas } from './canvas.js';

const ROW = 18;
const LABEL = 150;
const NOTE = 250;
// Rows drawn (the figures count every segment): the segments holding the most cached free memory
// first, where fragmentation lives.
const MAX_ROWS = 120;

// Figures of one segment, or of all of them together.
export function figures(segments) {
  let reserved = 0; let allocated = 0; let requested = 0; let free = 0; let largest = 0; let pending = 0;
  for (const s of segments) {
    reserved += s.total_size;
    for (const b of s.blocks) {
      if (b.state === 'active_allocated') { allocated += b.size; requested += b.requested_size; }
      else if (b.state === 'active_pending_free') pending += b.size;
      else { free += b.size; largest = Math.max(largest, b.size); }
    }
  }
  // PyTorch's view of fragmentation: free bytes that no single request can use whole.
  const fragmentation = free > 0 ? 1 - largest / free : 0;
  return { reserved, allocated, requested, waste: allocated - requested, free, largest, pending, fragmentation };
}

export function describeState(state) {
  const f = figures(state.segments);
  const pct = (x) => `${(x * 100).toFixed(0)}%`;
  return `<b>${state.segments.length}</b> segments, <b>${formatBytes(f.reserved)}</b> reserved: `
    + `${formatBytes(f.requested)} requested by live tensors, ${formatBytes(f.waste)} rounding waste, `
    + `${formatBytes(f.free)} cached free (largest block ${formatBytes(f.largest)}; fragmentation ${pct(f.fragmentation)}, the share of free bytes outside the largest free block)`
    + (f.pending ? `, ${formatBytes(f.pending)} freed but waiting on other streams` : '') + '.';
}

export function drawSegments(canvas, state, colorOf) {
  const free = (s) => s.blocks.reduce((sum, b) => sum + (b.state === 'inactive' ? b.size : 0), 0);
  const segments = state.segments.map((s) => ({ ...s, free: free(s) })).sort((x, y) => y.free - x.free || x.address - y.address);
  const rows = Math.min(segments.length, MAX_ROWS);
  const { ctx, width } = prepareCanvas(canvas, Math.max(1, rows + (segments.length > rows ? 1 : 0)) * ROW + 4);
  const largest = Math.max(1, ...segments.map((s) => s.total_size));
  const barWidth = Math.max(50, width - LABEL - NOTE - 16);
  if (!segments.length) {
    ctx.fillStyle = '#667085';
    ctx.fillText('No segments are reserved at this point.', 8, ROW / 2 + 2);
    return;
  }
  for (let r = 0; r < rows; r++) {
    const s = segments[r];
    const y = 2 + r * ROW;
    const w = Math.max(24, (s.total_size / largest) * barWidth);
    const scale = w / s.total_size;
    ctx.fillStyle = '#667085';
    ctx.textAlign = 'right';
    ctx.fillText(`${formatBytes(s.total_size)} ${s.segment_type}${s.is_expandable ? ' expandable' : ''}${s.stream ? ` stream ${s.stream}` : ''}`, LABEL - 8, y + ROW / 2);
    ctx.textAlign = 'left';
    const x0 = LABEL;
    for (const b of s.blocks) {
      const bx = x0 + (b.address - s.address) * scale;
      const bw = Math.max(1, b.size * scale);
      if (b.state === 'active_allocated') {
        ctx.fillStyle = colorOf(b.address);
        ctx.fillRect(bx, y + 2, bw, ROW - 5);
        const waste = (b.size - b.requested_size) * scale;
        if (waste >= 0.5) {
          ctx.fillStyle = '#1d2430';
          ctx.fillRect(bx + bw - waste, y + 2, waste, ROW - 5);
        }
      } else {
        ctx.fillStyle = b.state === 'active_pending_free' ? '#f1ce63' : '#e9ecf1';
        ctx.fillRect(bx, y + 2, bw, ROW - 5);
      }
      // Block boundaries, where they are wide enough to show.
      if (bw >= 3) {
        ctx.fillStyle = '#ffffff';
        ctx.fillRect(bx + bw - 1, y + 2, 1, ROW - 5);
      }
    }
    ctx.strokeStyle = '#c9ced8';
    ctx.strokeRect(x0 + 0.5, y + 1.5, w, ROW - 4);
    const f = figures([s]);
    ctx.fillStyle = f.free ? '#1d2430' : '#98a2b3';
    ctx.fillText(f.free ? `free ${formatBytes(f.free)} · largest ${formatBytes(f.largest)} · frag ${(f.fragmentation * 100).toFixed(0)}%` : 'full',
      x0 + barWidth + 12, y + ROW / 2);
  }
  if (segments.length > rows) {
    ctx.fillStyle = '#667085';
    ctx.fillText(`and ${segments.length - rows} more segments with less cached free memory (the figures above count them all)`, LABEL, 2 + rows * ROW + ROW / 2);
  }
}
