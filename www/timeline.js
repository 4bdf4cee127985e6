// The active memory timeline: every allocation a band (a run of rectangles laid out by the wasm
// side, stacked as MemoryViz stacks them), reserved memory as a line above, the what-if curve,
// the peak, markers, record_function scopes and a cursor. The bands are rasterised by the worker
// (src/timeline/raster.rs) into an image covering the view and a view-width each side; frames
// only place that image, so panning and zooming cost the same whatever the trace size.
//
// The keyboard does what the pointer does (the canvas is focusable): ←/→ move the cursor (with
// Shift a tenth of the view; Home/End to the ends), ↑/↓ pick a band at the cursor (the keyboard's
// hover), +/− zoom around the cursor, 0 resets the view, Enter pins the band picked, Escape
// unpins.
import { formatBytes, formatTime } from './format.js';
import { painting } from './timeline-paint.js';
import { input } from './timeline-input.js';
import { colorGroups, topBytes, GHOST } from './palette.js';

const MARGIN = { left: 74, right: 16, top: 18, bottom: 30 };

export class Timeline {
  constructor(canvas, tooltip) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.ctx = canvas.getContext('2d');
    this.data = null;
    this.hidden = new Set();
    this.axis = 'event';
    this.cursor = null;
    this.pinned = null;
    this.hover = null;
    // The band picked with ↑/↓ at the cursor, and a height in it (bytes; its bottom there): when
    // the cursor moves past its end, the band at that height is picked.
    this.selected = null;
    this.selectedHeight = 0;
    this.replay = null;
    // Allocations a diagnosis finding names, outlined together (see setHighlight).
    this.highlighted = [];
    this.listeners = {};
    // Keyboard steps that ask the worker run one after another.
    this.keyQueue = Promise.resolve();
    // A frame is already queued with requestAnimationFrame.
    this.frameQueued = false;
    // The image asked of the worker and not back yet ({x0, x1, key}), if any.
    this.pendingLayer = null;
    this.attachEvents();
    new ResizeObserver(() => this.requestDraw()).observe(canvas);
  }

  on(name, fn) { this.listeners[name] = fn; }
  emit(name, value) { if (this.listeners[name]) this.listeners[name](value); }

  // data: {view, arrays, meta} from the worker; `first` ({width, height}): the worker is drawing
  // the whole trace by event index at that size and will post it (see acceptFirstImage).
  setData(data, first = null) {
    const { arrays: a, meta } = data;
    this.data = data;
    this.preview = null;
    this.beforePreview = null;
    this.positions = a.allocated.length; // events + 1
    this.hidden = new Set();
    this.layer = null;
    this.pendingLayer = null;
    this.layerTicket = (this.layerTicket || 0) + 1;
    this.mask = null;
    this.maskVersion = 0;
    this.replay = null;
    this.highlighted = [];
    this.pinned = null;
    this.hover = null;
    this.selected = null;
    this.stackCache = null;
    clearTimeout(this.cursorTimer);
    if (this.keyTooltip) this.tooltip.hidden = true;
    this.keyTooltip = false;
    this.pieceCache = new Map();
    this.hoverTicket = (this.hoverTicket || 0) + 1;
    const { order, colors, pixels } = colorGroups(meta.groups);
    this.groupOrder = order;
    this.groupColor = colors;
    this.groupPixel = pixels;
    this.cursor = meta.summary.peak_x;
    this.setAxis(this.axis);
    // The worker is drawing the whole trace (see worker.js): wait for that image rather than ask
    // for the same again; otherwise ask now, ahead of the panels' own requests to the worker.
    this.firstImage = null;
    if (first && this.axis === 'event') {
      const key = this.layerKey(this.plot, this.yMax(), window.devicePixelRatio || 1);
      this.firstImage = { ...first, pending: { x0: 0, x1: this.xAt(this.positions), key } };
      this.pendingLayer = this.firstImage.pending;
    }
    this.draw();
    // Resolved once the first image of this trace is on screen at its exact scale.
    return new Promise((resolve) => { this.onPainted = resolve; });
  }

  // The bands' pieces of `data` laid out again (fully, where the first image came from a layout
  // for it alone), whether or not it is on screen now (a preview may be): hovering reads them at
  // once, and the image is drawn again from them; the one on screen stays until then.
  setPieces(data, { pieceOffsets, pieceX0, pieceY }) {
    Object.assign(data.arrays, { pieceOffsets, pieceX0, pieceY });
    this.pieceCache = new Map();
    this.stackCache = null;
    this.piecesVersion = (this.piecesVersion || 0) + 1;
    this.requestDraw();
  }

  // An image of the whole canvas as it was drawn when the same file was last opened (ImageData),
  // shown until setData: scaled to the canvas, and answering no pointer or key (no data).
  // clearPreview brings back the trace shown before.
  showPreview(image) {
    if (!this.preview) this.beforePreview = this.data;
    const canvas = document.createElement('canvas');
    canvas.width = image.width;
    canvas.height = image.height;
    canvas.getContext('2d').putImageData(image, 0, 0);
    this.preview = canvas;
    this.data = null;
    this.hover = null;
    this.tooltip.hidden = true;
    this.requestDraw();
  }

  clearPreview() {
    if (!this.preview) return;
    this.data = this.beforePreview;
    this.preview = null;
    this.beforePreview = null;
    this.requestDraw();
  }

  // Colours the bands by another grouping (the worker's answer to 'colorBy': each allocation's
  // group, and the groups): the legend's hidden groups are cleared, and the image on screen stays
  // until the new one arrives.
  setGrouping(allocGroup, groups) {
    this.data.arrays.allocGroup = allocGroup;
    this.data.meta.groups = groups;
    const { order, colors, pixels } = colorGroups(groups);
    this.groupOrder = order;
    this.groupColor = colors;
    this.groupPixel = pixels;
    this.hidden = new Set();
    this.groupingVersion = (this.groupingVersion || 0) + 1;
    // A band's tooltip names its group: the keyboard's is described again, the pointer's waits
    // for the next move.
    if (this.keyTooltip) this.placeKeyTooltip(); else this.tooltip.hidden = true;
    this.requestDraw();
  }

  // x coordinate (axis units) of every position, and one past the end: `xs` on the time axis;
  // on the event axis a position is its own coordinate and no array is held (a 1 M event trace
  // would hold 8 MB here and again in the worker).
  setAxis(axis) {
    if (!this.data) { this.axis = axis; return; }
    const { timeUs } = this.data.arrays;
    const hasTime = this.data.meta.summary.has_time;
    this.axis = axis === 'time' && hasTime ? 'time' : 'event';
    const n = this.positions;
    let xs = null;
    if (this.axis === 'time') {
      xs = new Float64Array(n + 1);
      let first = NaN;
      for (let i = 0; i < n; i++) if (!Number.isNaN(timeUs[i])) { first = timeUs[i]; break; }
      let last = 0;
      for (let i = 0; i < n; i++) {
        const t = Number.isNaN(timeUs[i]) ? last : Math.max(last, timeUs[i] - first);
        xs[i] = t;
        last = t;
      }
      xs[n] = last + Math.max(1, last / n);
    }
    this.xs = xs;
    this.layer = null;
    // The worker takes an empty array for the event axis.
    this.backend.setAxis(xs ? xs.slice() : new Float64Array(0));
    this.resetView();
  }

  // The axis coordinate of position i (i = positions: one past the end).
  xAt(i) {
    return this.xs ? this.xs[i] : i;
  }

  resetView() {
    this.view = [0, this.xAt(this.positions)];
    this.requestDraw();
  }

  setReplay(replay) {
    this.replay = replay;
    // Its peak sets the y scale with the trace's (found once, not on every frame).
    this.replayPeak = 0;
    if (replay) for (const v of replay.reserved_curve) this.replayPeak = Math.max(this.replayPeak, v);
    this.replayVersion = (this.replayVersion || 0) + 1;
    this.requestDraw();
  }

  // Allocations to outline together (a finding's evidence), or none.
  setHighlight(ids) {
    this.highlighted = ids ? [...ids] : [];
    this.emit('highlight', this.highlighted);
    this.requestDraw();
  }

  // Allocations hidden by the search filter (1 = hidden), or null.
  setMask(mask) {
    this.mask = mask;
    this.maskVersion++;
    this.requestDraw();
  }

  isHidden(id) {
    return this.hidden.has(this.data.arrays.allocGroup[id]) || (this.mask !== null && this.mask[id] === 1);
  }

  toggleGroup(g) {
    if (this.hidden.has(g)) this.hidden.delete(g); else this.hidden.add(g);
    this.requestDraw();
  }

  requestDraw() {
    if (this.frameQueued) return;
    this.frameQueued = true;
    requestAnimationFrame(() => {
      this.frameQueued = false;
      const started = performance.now();
      this.draw();
      // The browser benchmark (tests/e2e/bench.mjs) reads how long each frame's drawing took.
      if (window.__frameTimes) window.__frameTimes.push(performance.now() - started);
    });
  }

  // ---- geometry
  get plot() {
    const w = this.canvas.clientWidth;
    const h = this.canvas.clientHeight;
    return { x: MARGIN.left, y: MARGIN.top, w: Math.max(10, w - MARGIN.left - MARGIN.right), h: Math.max(10, h - MARGIN.top - MARGIN.bottom) };
  }

  yMax() {
    return topBytes(this.data.meta.summary, this.replay ? this.replayPeak : 0);
  }

  pxOfX(x, p = this.plot) {
    return p.x + ((x - this.view[0]) / (this.view[1] - this.view[0])) * p.w;
  }

  xOfPx(px, p = this.plot) {
    return this.view[0] + ((px - p.x) / p.w) * (this.view[1] - this.view[0]);
  }

  // The position whose column holds axis coordinate x.
  positionAt(x) {
    const xs = this.xs;
    if (!xs) return Math.max(0, Math.min(this.positions - 1, Math.floor(x)));
    let lo = 0;
    let hi = this.positions - 1;
    if (x <= xs[0]) return 0;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (xs[mid] <= x) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  // The allocation drawn at canvas point (px, py): the backend (the page itself, hit.js) answers
  // with its id or null (allocations drawn as ghosts are skipped).
  hitTest(px, py) {
    const p = this.plot;
    if (!this.data || px < p.x || px > p.x + p.w || py < p.y || py > p.y + p.h) return Promise.resolve(null);
    const pos = this.positionAt(this.xOfPx(px, p));
    const bytes = ((p.y + p.h - py) / p.h) * this.yMax();
    // Slack of one pixel so thin bands can be hovered.
    return this.backend.hitTest({ pos, bytes, slack: this.yMax() / p.h });
  }

  // An allocation's rectangles ([x0, x1, y] triples), fetched from the worker once; null until
  // they arrive (the outline is drawn then).
  piecesOf(id) {
    const known = this.pieceCache.get(id);
    if (known !== undefined) return known;
    if (this.pieceCache.size > 64) this.pieceCache.clear();
    this.pieceCache.set(id, null);
    const data = this.data;
    this.backend.pieces(id).then((pieces) => {
      if (data !== this.data) return;
      this.pieceCache.set(id, pieces);
      this.requestDraw();
    }, () => this.pieceCache.delete(id));
    return null;
  }

  // ---- drawing
  //
  // Two layers. The bands and curves are rendered into an offscreen "layer" covering the view and
  // one view-width on each side; while the user pans and zooms, frames only copy the layer into
  // place (a few milliseconds whatever the trace size), and the layer is re-rendered at full
  // quality once the view has settled. Axes, cursor, peak, markers and outlines are drawn on top
  // every frame.
  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth;
    const h = c.clientHeight;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const ctx = this.ctx;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    if (!this.data && this.preview) {
      ctx.drawImage(this.preview, 0, 0, w, h);
      return;
    }
    if (!this.data) {
      ctx.fillStyle = '#98a2b3';
      ctx.font = '14px system-ui, sans-serif';
      ctx.fillText('Open a snapshot or run a scenario.', MARGIN.left, 40);
      return;
    }
    const p = this.plot;
    const ymax = this.yMax();
    this.drawAxes(ctx, p, ymax);
    const [v0, v1] = this.view;
    const key = this.layerKey(p, ymax, dpr);
    const l = this.layer;
    const covers = (x) => x && x.key === key && x.x0 <= v0 && x.x1 >= v1;
    if (!covers(l) && !covers(this.pendingLayer)) this.requestLayer(p, ymax, dpr);
    // Until the exact image arrives, the last one is stretched into place.
    let exact = false;
    if (l) {
      const scale = l.canvas.width / (l.x1 - l.x0);
      const sx = (v0 - l.x0) * scale;
      const sw = (v1 - v0) * scale;
      ctx.save();
      ctx.beginPath();
      ctx.rect(p.x, p.y, p.w, p.h);
      ctx.clip();
      const left = p.x - (sx / sw) * p.w;
      ctx.drawImage(l.canvas, left, p.y, (l.canvas.width / sw) * p.w, p.h);
      ctx.restore();
      exact = l.key === key && Math.abs(sw / dpr - p.w) < 0.5;
      if (exact && this.onPainted) {
        const done = this.onPainted;
        this.onPainted = null;
        done();
      }
    }
    clearTimeout(this.settle);
    if (l && !exact) this.settle = setTimeout(() => this.requestLayer(this.plot, this.yMax(), dpr), 120);

    ctx.save();
    ctx.beginPath();
    ctx.rect(p.x, p.y, p.w, p.h);
    ctx.clip();
    for (const id of this.highlighted) if (id !== this.pinned) this.outline(ctx, id, '#f59e0b', 2.5);
    this.outline(ctx, this.pinned, '#e11d48', 2);
    if (this.hover !== this.pinned) this.outline(ctx, this.hover, '#ffffff', 1.5);
    if (this.selected !== this.pinned && this.selected !== this.hover) {
      this.outline(ctx, this.selected, '#ffffff', 3);
      this.outline(ctx, this.selected, '#111827', 1.5);
    }
    if (this.replay && this.replay.oomPosition != null) this.vline(ctx, this.replay.oomPosition, '#a3261b', 'out of memory', [2, 2]);
    const s = this.data.meta.summary;
    this.vline(ctx, s.peak_x, 'rgba(17,24,39,.55)', `peak ${formatBytes(s.peak_allocated_bytes)}`, [3, 3]);
    for (const m of this.data.meta.markers) this.marker(ctx, m);
    this.drawSpans(ctx, p);
    if (this.cursor != null) this.drawCursor(ctx, p);
    ctx.restore();
    this.showState();
  }

  // The cursor: a line; with the keyboard on the timeline, a thicker one with handles and the
  // position it names, so it can be followed without a pointer.
  drawCursor(ctx, p) {
    const focused = this.canvas.matches(':focus-visible');
    if (!focused) return this.vline(ctx, this.cursor, '#3a5bd9', null, []);
    const x = Math.round(this.pxOfX(this.xAt(Math.min(this.cursor, this.positions - 1)), p)) + 0.5;
    if (x < p.x || x > p.x + p.w) return;
    ctx.strokeStyle = '#3a5bd9';
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(x, p.y);
    ctx.lineTo(x, p.y + p.h);
    ctx.stroke();
    ctx.fillStyle = '#3a5bd9';
    for (const [y, dy] of [[p.y, 7], [p.y + p.h, -7]]) {
      ctx.beginPath();
      ctx.moveTo(x - 6, y);
      ctx.lineTo(x + 6, y);
      ctx.lineTo(x, y + dy);
      ctx.fill();
    }
    const label = this.cursor === 0 ? 'cursor: start of the trace' : `cursor: after event ${this.cursor - 1}`;
    ctx.font = '11px system-ui, sans-serif';
    ctx.textAlign = 'left';
    ctx.textBaseline = 'alphabetic';
    const width = ctx.measureText(label).width;
    const lx = x + 8 + width > p.x + p.w ? x - 8 - width : x + 8;
    ctx.fillStyle = '#3a5bd9';
    ctx.fillRect(lx - 3, p.y + 16, width + 6, 15);
    ctx.fillStyle = '#ffffff';
    ctx.fillText(label, lx, p.y + 27);
  }

  // What the page (and its tests) can read of the timeline's state: the cursor, the band picked
  // and the one pinned as data- attributes of the canvas, the view as the range label's.
  showState() {
    const d = this.canvas.dataset;
    const set = (key, value) => { const v = value == null ? '' : String(value); if (d[key] !== v) d[key] = v; };
    set('cursor', this.cursor);
    set('selected', this.selected);
    set('pinned', this.pinned);
    set('highlighted', this.highlighted.join(' '));
    const label = this.rangeLabel;
    if (!label) return;
    const [v0, v1] = this.view;
    let text;
    if (this.axis === 'time') {
      text = `${formatTime(v0)} to ${formatTime(v1)}`;
    } else {
      const events = this.positions - 1;
      const first = Math.max(0, Math.ceil(v0) - 1);
      const last = Math.max(first, Math.min(events - 1, Math.ceil(v1) - 2));
      text = `events ${first.toLocaleString('en-US')} to ${last.toLocaleString('en-US')} of ${events.toLocaleString('en-US')}`;
    }
    const full = this.xAt(this.positions);
    const zoom = full / (v1 - v0);
    if (zoom > 1.01) text += ` (zoomed ${zoom < 10 ? zoom.toFixed(1) : Math.round(zoom).toLocaleString('en-US')}×)`;
    if (label.textContent !== text) label.textContent = text;
    if (label.dataset.x0 !== String(v0)) label.dataset.x0 = String(v0);
    if (label.dataset.x1 !== String(v1)) label.dataset.x1 = String(v1);
  }

  // What a layer depends on besides the view.
  layerKey(p, ymax, dpr) {
    return `${p.w}x${p.h}@${dpr}|${ymax}|${[...this.hidden].join(',')}|${this.maskVersion}|${this.axis}|${this.replayVersion || 0}|${this.groupingVersion || 0}|${this.piecesVersion || 0}`;
  }

  // Asks the worker for the bands of the view plus one view-width each side, at the view's
  // scale (rasterised in wasm: see src/timeline/raster.rs); the reserved curves are drawn on the
  // image when it arrives. Only the newest request is kept.
  requestLayer(p, ymax, dpr) {
    const [v0, v1] = this.view;
    const span = v1 - v0;
    const full = this.xAt(this.positions);
    const x0 = Math.max(0, v0 - span);
    const x1 = Math.min(full, v1 + span);
    const width = Math.max(1, Math.round(((x1 - x0) / span) * p.w * dpr));
    const height = Math.max(1, Math.round(p.h * dpr));
    const key = this.layerKey(p, ymax, dpr);
    const ticket = ++this.layerTicket;
    this.pendingLayer = { x0, x1, key };
    const data = this.data;
    this.backend.raster({
      x0, x1, width, height, ymax, order: this.groupOrder, colors: this.groupPixel, hidden: this.hiddenAllocations(), ghost: GHOST,
    }).then((pixels) => {
      if (ticket !== this.layerTicket || data !== this.data) return;
      this.acceptLayer(pixels, width, height, x0, x1, ymax, dpr);
      this.pendingLayer = null;
      this.requestDraw();
    }, (e) => {
      if (ticket !== this.layerTicket || data !== this.data) return;
      this.pendingLayer = null;
      this.emit('error', e);
    });
  }

  // The worker's image of the whole trace, drawn right after it laid out the timeline: the
  // layer, if it is still the one the view needs (the window may have been resized meanwhile).
  acceptFirstImage({ view, pixels, width, height }) {
    const expected = this.firstImage;
    if (!this.data || this.data.view !== view || !expected) return;
    this.firstImage = null;
    if (this.pendingLayer === expected.pending) this.pendingLayer = null;
    const p = this.plot;
    const dpr = window.devicePixelRatio || 1;
    const fits = width === Math.round(p.w * dpr) && height === Math.round(p.h * dpr);
    if (pixels && fits && this.layerKey(p, this.yMax(), dpr) === expected.pending.key) {
      this.acceptLayer(pixels, width, height, 0, this.xAt(this.positions), this.yMax(), dpr);
    }
    this.draw();
  }

  // Makes a rasterised image of [x0, x1) the layer, with the reserved curves drawn on it.
  acceptLayer(pixels, width, height, x0, x1, ymax, dpr) {
    // Two canvases take turns (the one on screen, the one being filled): no canvas per frame
    // for the garbage collector to find later.
    const canvas = this.spare || document.createElement('canvas');
    this.spare = this.layer ? this.layer.canvas : null;
    canvas.width = width;
    canvas.height = height;
    const ctx = canvas.getContext('2d');
    ctx.putImageData(new ImageData(new Uint8ClampedArray(pixels.buffer), width, height), 0, 0);
    const p = this.plot;
    const frame = { x0, x1, sx: width / (x1 - x0) / dpr, sy: height / ymax / dpr, h: p.h };
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.curve(ctx, frame, this.data.arrays.reserved, '#d0453a', 1.6, []);
    if (this.replay) this.curve(ctx, frame, this.replay.reserved_curve, '#111827', 1.6, [5, 3]);
    this.layer = { canvas, x0, x1, key: this.layerKey(p, ymax, dpr) };
  }

  // 1 for every allocation drawn as a ghost (its group hidden in the legend, or filtered out).
  hiddenAllocations() {
    const a = this.data.arrays;
    if (this.hidden.size === 0 && this.mask === null) return new Uint8Array(0);
    const out = this.mask ? this.mask.slice() : new Uint8Array(a.allocSize.length);
    if (this.hidden.size) for (let id = 0; id < out.length; id++) if (this.hidden.has(a.allocGroup[id])) out[id] = 1;
    return out;
  }

  // The painting helpers (outline, curve, vline, spans, markers, axes) are in timeline-paint.js;
  // the pointer and the keyboard in timeline-input.js.
}

Object.assign(Timeline.prototype, painting, input);
