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

// A segment's pool as PyTorch writes it: "0,0" is the default pool; "0,N" one the program made
// (graph_pool_handle(), MemPool()), "N,0" one a CUDA graph made for itself.
export const DEFAULT_POOL = '0,0';
export function poolOf(segment) {
  return (segment.segment_pool_id || [0, 0]).join(',');
}
const POOL_COLORS = ['#7f56d9', '#0e9384', '#c4320a', '#155eef', '#b54708', '#c11574'];

// The private pools of a state, each with its segments, most reserved first.
export function privatePools(state) {
  const byPool = new Map();
  for (const s of state.segments) {
    const pool = poolOf(s);
    if (pool === DEFAULT_POOL) continue;
    if (!byPool.has(pool)) byPool.set(pool, []);
    byPool.get(pool).push(s);
  }
  return [...byPool].map(([pool, segments]) => ({ pool, segments, ...figures(segments) })).sort((x, y) => y.reserved - x.reserved);
}

// Each private pool's colour: the order they are first seen by address, so it stays put as the
// cursor moves.
function poolColors(state) {
  const colors = new Map();
  for (const s of [...state.segments].sort((x, y) => x.address - y.address)) {
    const pool = poolOf(s);
    if (pool !== DEFAULT_POOL && !colors.has(pool)) colors.set(pool, POOL_COLORS[colors.size % POOL_COLORS.length]);
  }
  return colors;
}

export function describeState(state) {
  const f = figures(state.segments);
  const pct = (x) => `${(x * 100).toFixed(0)}%`;
  const pools = privatePools(state);
  const colors = poolColors(state);
  const poolLine = pools.length
    ? ` Private pools (CUDA graphs, MemPool) hold <b>${formatBytes(pools.reduce((sum, p) => sum + p.reserved, 0))}</b>: `
      + pools.map((p) => `<span class="pool-name" style="color:${colors.get(p.pool)}">pool (${p.pool})</span> ${formatBytes(p.reserved)} in ${p.segments.length} segment${p.segments.length === 1 ? '' : 's'}`
        + (p.free ? ` (${formatBytes(p.free)} cached free)` : '')).join(', ')
      + '. A pool\'s free blocks serve only what is allocated into that pool.'
    : '';
  return `<b>${state.segments.length}</b> segments, <b>${formatBytes(f.reserved)}</b> reserved: `
    + `${formatBytes(f.requested)} requested by live tensors, ${formatBytes(f.waste)} rounding waste, `
    + `${formatBytes(f.free)} cached free (largest block ${formatBytes(f.largest)}; fragmentation ${pct(f.fragmentation)}, the share of free bytes outside the largest free block)`
    + (f.pending ? `, ${formatBytes(f.pending)} freed but waiting on other streams` : '') + '.' + poolLine;
}

// `pool`: draw only that pool's segments ("0,0" the default pool's); null: all of them.
export function drawSegments(canvas, state, colorOf, pool = null) {
  const free = (s) => s.blocks.reduce((sum, b) => sum + (b.state === 'inactive' ? b.size : 0), 0);
  const colors = poolColors(state);
  // Room for "pool (0,1) " before the size where private pools exist.
  const label = colors.size ? LABEL + 70 : LABEL;
  const segments = state.segments.filter((s) => pool === null || poolOf(s) === pool)
    .map((s) => ({ ...s, free: free(s) })).sort((x, y) => y.free - x.free || x.address - y.address);
  const rows = Math.min(segments.length, MAX_ROWS);
  const { ctx, width } = prepareCanvas(canvas, Math.max(1, rows + (segments.length > rows ? 1 : 0)) * ROW + 4);
  const largest = Math.max(1, ...segments.map((s) => s.total_size));
  const barWidth = Math.max(50, width - label - NOTE - 16);
  if (!segments.length) {
    ctx.fillStyle = '#667085';
    ctx.fillText(pool === null ? 'No segments are reserved at this point.' : `Pool (${pool}) holds no segment at this point.`, 8, ROW / 2 + 2);
    return;
  }
  for (let r = 0; r < rows; r++) {
    const s = segments[r];
    const y = 2 + r * ROW;
    const w = Math.max(24, (s.total_size / largest) * barWidth);
    const scale = w / s.total_size;
    ctx.fillStyle = '#667085';
    ctx.textAlign = 'right';
    const owner = poolOf(s);
    const poolLabel = owner === DEFAULT_POOL ? '' : `pool (${owner}) `;
    ctx.fillText(`${poolLabel}${formatBytes(s.total_size)} ${s.segment_type}${s.is_expandable ? ' expandable' : ''}${s.stream ? ` stream ${s.stream}` : ''}`, label - 8, y + ROW / 2);
    ctx.textAlign = 'left';
    if (owner !== DEFAULT_POOL) {
      // A private pool's segments carry its colour at their start.
      ctx.fillStyle = colors.get(owner);
      ctx.fillRect(label - 5, y + 2, 3, ROW - 5);
    }
    const x0 = label;
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
    ctx.fillText(`and ${segments.length - rows} more segments with less cached free memory (the figures above count them all)`, label, 2 + rows * ROW + ROW / 2);
  }
}
