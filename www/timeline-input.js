// The timeline's pointer and keyboard, methods of Timeline (timeline.js): wheel zoom, drag to
// pan, hover and pin a band, and the keys that do what the pointer does.
import { escapeHtml } from './format.js';

export const input = {
  attachEvents() {
    const c = this.canvas;
    let drag = null;
    c.addEventListener('wheel', (e) => {
      if (!this.data) return;
      e.preventDefault();
      const rect = c.getBoundingClientRect();
      const x = this.xOfPx(e.clientX - rect.left);
      const factor = Math.exp(Math.sign(e.deltaY) * Math.min(Math.abs(e.deltaY), 200) * 0.0025);
      this.zoomAround(x, factor);
    }, { passive: false });
    c.addEventListener('pointerdown', (e) => {
      if (!this.data) return;
      c.setPointerCapture(e.pointerId);
      drag = { x: e.clientX, view: this.view.slice(), moved: false };
    });
    c.addEventListener('pointermove', (e) => {
      if (!this.data) return;
      const rect = c.getBoundingClientRect();
      if (drag) {
        const dx = e.clientX - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        if (drag.moved) {
          const span = drag.view[1] - drag.view[0];
          const shift = (-dx / this.plot.w) * span;
          this.setView(drag.view[0] + shift, drag.view[1] + shift);
          return;
        }
      }
      this.hoverAt(e.clientX - rect.left, e.clientY - rect.top);
    });
    c.addEventListener('pointerup', (e) => {
      if (!this.data || !drag) return;
      const moved = drag.moved;
      drag = null;
      if (moved) return;
      const rect = c.getBoundingClientRect();
      const px = e.clientX - rect.left;
      const py = e.clientY - rect.top;
      const p = this.plot;
      if (px < p.x || px > p.x + p.w) return;
      clearTimeout(this.cursorTimer);
      this.cursor = this.positionAt(this.xOfPx(px));
      this.emit('cursor', this.cursor);
      this.requestDraw();
      const data = this.data;
      this.hitTest(px, py).then((id) => {
        if (data !== this.data) return;
        // The keyboard goes on from the band clicked.
        this.selected = id;
        this.selectedHeight = id == null ? 0 : Math.max(0, ((p.y + p.h - py) / p.h) * this.yMax() - this.data.arrays.allocSize[id] / 2);
        this.pin(id);
      }, () => {}); // asked of a timeline the page has since left
    });
    c.addEventListener('pointerleave', () => {
      this.hoverTicket++;
      this.hoverNext = null;
      this.hover = null;
      if (!this.keyTooltip) this.tooltip.hidden = true;
      this.requestDraw();
    });
    c.addEventListener('dblclick', () => this.resetView());
    c.addEventListener('keydown', (e) => this.onKey(e));
    // The cursor is drawn larger, and named, while the keyboard is on the timeline.
    c.addEventListener('focus', () => this.requestDraw());
    c.addEventListener('blur', () => {
      if (this.keyTooltip) this.tooltip.hidden = true;
      this.keyTooltip = false;
      this.requestDraw();
    });
  },

  pin(id) {
    this.pinned = id;
    this.emit('pin', id);
    this.requestDraw();
  },

  // ---- keyboard
  onKey(e) {
    if (!this.data || e.altKey || e.ctrlKey || e.metaKey) return;
    const [v0, v1] = this.view;
    const here = this.xAt(this.cursor);
    switch (e.key) {
      case 'ArrowLeft':
      case 'ArrowRight': {
        const dir = e.key === 'ArrowLeft' ? -1 : 1;
        let to = this.cursor + dir;
        if (e.shiftKey) {
          const far = this.positionAt(here + (dir * (v1 - v0)) / 10);
          to = dir < 0 ? Math.min(to, far) : Math.max(to, far);
        }
        this.moveCursor(to);
        break;
      }
      case 'Home': this.moveCursor(0); break;
      case 'End': this.moveCursor(this.positions - 1); break;
      case 'ArrowUp': this.queue(() => this.stepBand(1)); break;
      case 'ArrowDown': this.queue(() => this.stepBand(-1)); break;
      case '+':
      case '=': this.zoomAround(here, 1 / 1.5); this.placeKeyTooltip(); break;
      case '-':
      case '_': this.zoomAround(here, 1.5); this.placeKeyTooltip(); break;
      case '0': this.resetView(); this.placeKeyTooltip(); break;
      case 'Enter':
      case ' ':
        this.queue(async () => {
          // Nothing picked yet: the band on top at the cursor.
          if (this.selected == null) await this.stepBand(-1);
          this.pin(this.pinned === this.selected ? null : this.selected);
        });
        break;
      case 'Escape':
        if (this.pinned != null) this.pin(null);
        else if (this.selected != null) this.select(null);
        else if (this.highlighted.length) this.setHighlight(null);
        else return;
        break;
      default:
        return;
    }
    e.preventDefault();
  },

  queue(step) {
    const data = this.data;
    this.keyQueue = this.keyQueue.then(() => (data === this.data ? step() : null)).catch(() => {});
    return this.keyQueue;
  },

  // Moves the cursor to a position, keeps it in view, and follows the band picked (or the one at
  // its height) there. The panels follow once the keys rest: each asks the worker for a replay.
  moveCursor(to) {
    to = Math.max(0, Math.min(this.positions - 1, to));
    if (to === this.cursor) return;
    this.cursor = to;
    const [v0, v1] = this.view;
    const x = this.xAt(to);
    const span = v1 - v0;
    if (x < v0) this.setView(x - span * 0.1, x + span * 0.9);
    else if (x > v1 - (this.xs ? 0 : 1)) this.setView(x - span * 0.9, x + span * 0.1);
    this.requestDraw();
    clearTimeout(this.cursorTimer);
    this.cursorTimer = setTimeout(() => this.emit('cursor', this.cursor), 150);
    if (this.selected != null) this.queue(() => this.follow());
  },

  // The live bands at the cursor, bottom up ([{id, bottom}]), asked of the worker once per
  // position and image (hidden bands are skipped as in the image on screen).
  async stackAtCursor() {
    const pos = this.cursor;
    const key = `${pos}|${this.layer ? this.layer.key : ''}`;
    if (this.stackCache && this.stackCache.key === key) return this.stackCache.bands;
    const pairs = await this.backend.stackAt(pos);
    const bands = [];
    for (let i = 0; i < pairs.length; i += 2) bands.push({ id: pairs[i], bottom: pairs[i + 1] });
    this.stackCache = { key, bands };
    return bands;
  },

  // ↑ (dir 1) picks the band above the one picked, ↓ the one below; with none picked, ↑ starts
  // at the bottom and ↓ at the top.
  async stepBand(dir) {
    const bands = await this.stackAtCursor();
    if (!bands.length) return this.select(null);
    let k = bands.findIndex((b) => b.id === this.selected);
    k = k < 0 ? (dir > 0 ? 0 : bands.length - 1) : Math.max(0, Math.min(bands.length - 1, k + dir));
    this.select(bands[k].id, bands[k].bottom);
  },

  // After the cursor moved: the band picked if it is still live, else the one at its height.
  async follow() {
    const bands = await this.stackAtCursor();
    const same = bands.find((b) => b.id === this.selected);
    if (same) return this.select(same.id, same.bottom, false);
    const a = this.data.arrays;
    // The middle of the band picked, at the cursor's last position.
    const mid = this.selectedHeight + a.allocSize[this.selected] / 2;
    let best = null;
    for (const b of bands) {
      const d = mid < b.bottom ? b.bottom - mid : Math.max(0, mid - (b.bottom + a.allocSize[b.id]));
      if (!best || d < best.d) best = { ...b, d };
    }
    this.select(best ? best.id : null, best ? best.bottom : 0, false);
  },

  // Picks a band with the keyboard: outlined, described beside the cursor, and announced (not
  // while it only follows the cursor: the cursor's own announcement comes then).
  select(id, bottom = 0, announce = true) {
    this.selected = id;
    this.selectedHeight = bottom;
    this.requestDraw();
    if (announce) this.emit('select', id);
    if (id == null) {
      if (this.keyTooltip) this.tooltip.hidden = true;
      this.keyTooltip = false;
      return;
    }
    this.keyTooltip = true;
    this.placeKeyTooltip();
  },

  // The band picked, described beside the cursor at its height.
  placeKeyTooltip() {
    if (!this.keyTooltip || this.selected == null) return;
    const p = this.plot;
    const size = this.data.arrays.allocSize[this.selected];
    const px = this.pxOfX(this.xAt(this.cursor), p);
    const py = p.y + p.h - ((this.selectedHeight + size / 2) / this.yMax()) * p.h;
    this.showTooltip(Math.max(p.x, Math.min(p.x + p.w, px)), Math.max(p.y, Math.min(p.y + p.h, py)), this.describe ? this.describe(this.selected) : '');
    this.keyTooltip = true;
  },

  zoomAround(x, factor) {
    const [v0, v1] = this.view;
    this.setView(x - (x - v0) * factor, x + (v1 - x) * factor);
  },

  setView(a, b) {
    const full = this.xAt(this.positions);
    const minSpan = Math.min(full, this.axis === 'time' ? 1 : 4);
    let span = Math.max(b - a, minSpan);
    span = Math.min(span, full);
    a = Math.max(0, Math.min(a, full - span));
    this.view = [a, a + span];
    this.requestDraw();
  },

  hoverAt(px, py) {
    const span = this.spanAt(px, py);
    if (span) {
      // A band's answer still on its way must not replace this tooltip.
      this.hoverTicket++;
      this.hoverNext = null;
      this.showTooltip(px, py, `<b>${escapeHtml(span.name)}</b><br>record_function scope, events ${Math.max(0, span.x0 - 1)} to ${Math.max(0, span.x1 - 1)}`);
      return;
    }
    // One hit test at a time; a move while one is out asks again for the newest point.
    if (this.hoverBusy) {
      this.hoverNext = [px, py];
      return;
    }
    this.hoverBusy = true;
    const ticket = this.hoverTicket;
    const data = this.data;
    this.hitTest(px, py).then((id) => {
      this.hoverBusy = false;
      const next = this.hoverNext;
      this.hoverNext = null;
      if (ticket === this.hoverTicket && data === this.data) this.showHover(id, px, py);
      if (next) this.hoverAt(...next);
    }, () => { this.hoverBusy = false; });
  },

  showHover(id, px, py) {
    if (id !== this.hover) {
      this.hover = id;
      this.requestDraw();
    }
    if (id == null) {
      if (!this.keyTooltip) this.tooltip.hidden = true;
      return;
    }
    this.emit('hover', id);
    this.showTooltip(px, py, this.describe ? this.describe(id) : '');
  },

  // `html` is made by the page with every name from the trace escaped (see describe in app.js).
  showTooltip(px, py, html) {
    this.keyTooltip = false;
    this.tooltip.innerHTML = html;
    this.tooltip.hidden = false;
    const wrap = this.canvas.getBoundingClientRect();
    const tw = this.tooltip.offsetWidth;
    const th = this.tooltip.offsetHeight;
    const left = px + 16 + tw > wrap.width ? px - 16 - tw : px + 16;
    const top = Math.min(Math.max(4, py - th / 2), wrap.height - th - 4);
    this.tooltip.style.left = `${Math.max(0, left)}px`;
    this.tooltip.style.top = `${top}px`;
  },
};
