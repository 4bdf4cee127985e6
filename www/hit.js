// The allocation drawn at a point of the timeline, found by the page itself: what
// `Timeline::hit_test` (src/timeline/mod.rs) answers in the worker, from the same arrays, so
// that a hover is answered at once even while the worker is busy (the doctor on a large file
// takes seconds). `a`: the timeline's arrays (allocStart, allocEnd, allocSize, pieceOffsets,
// pieceX0, pieceY); `pos`: a position; `bytes`: the height pointed at; `slack`: how near a
// thin band counts; `hidden(id)`: allocations left out (drawn as ghosts). Returns an id or null.
export function hitTest(a, pos, bytes, slack, hidden) {
  const { allocStart: start, allocEnd: end, allocSize: size, pieceOffsets: offsets, pieceX0: x0, pieceY: ys } = a;
  // The band holding `bytes`: where f32 heights let two bands overlap by a rounding error, the
  // upper one, whose bottom is the true boundary (on a tie, the later allocation).
  let under = -1;
  let underBottom = 0;
  let near = -1;
  for (let id = 0; id < size.length; id++) {
    if (start[id] > pos || end[id] <= pos || hidden(id)) continue;
    // The pieces tile the allocation's lifetime: the last that starts at or before `pos` holds it.
    let lo = offsets[id];
    let hi = offsets[id + 1];
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (x0[mid] <= pos) lo = mid + 1; else hi = mid;
    }
    if (lo === offsets[id]) continue;
    const y = ys[lo - 1];
    const s = size[id];
    if (bytes >= y && bytes < y + s) {
      if (under < 0 || y >= underBottom) {
        under = id;
        underBottom = y;
      }
    } else if (bytes >= y - slack && bytes < y + s + slack) {
      near = id;
    }
  }
  if (under >= 0) return under;
  return near >= 0 ? near : null;
}
