// The timeline's painting helpers, methods of Timeline (timeline.js): a band's outline, a curve
// at the layer's resolution, vertical lines, record_function scopes, markers and the axes.
import { formatBytes, formatTime, ticks } from './format.js';
import { HEADROOM } from './palette.js';

export const painting = {
  outline(ctx, id, color, width) {
    if (id == null) return;
    const pieces = this.piecesOf(id);
    if (!pieces) return;
    const p = this.plot;
    const sy = p.h / this.yMax();
    const base = p.y + p.h;
    const size = this.data.arrays.allocSize[id];
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.beginPath();
    for (let i = 0; i < pieces.length; i += 3) {
      const left = this.pxOfX(this.xAt(pieces[i]), p);
      const right = this.pxOfX(this.xAt(pieces[i + 1]), p);
      ctx.rect(left, base - (pieces[i + 2] + size) * sy, Math.max(right - left, 1), Math.max(size * sy, 1));
    }
    ctx.stroke();
  },

  // A step curve over positions in the layer's frame; where several positions share a pixel
  // column, the column's maximum (peaks are never lost).
  curve(ctx, f, values, color, width, dash) {
    const xs = this.xs;
    const xAt = xs ? (i) => xs[i] : (i) => i;
    const n = Math.min(values.length, this.positions);
    const limit = (f.x1 - f.x0) * f.sx;
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.setLineDash(dash);
    ctx.beginPath();
    let started = false;
    const point = (x, y) => {
      if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
    };
    let column = null;
    let columnMax = 0;
    const flush = () => {
      if (column === null) return;
      const y = f.h - columnMax * f.sy;
      point(column, y);
      point(column + 1, y);
      column = null;
    };
    for (let i = Math.max(0, this.positionAt(f.x0) - 1); i < n; i++) {
      const left = (xAt(i) - f.x0) * f.sx;
      if (left > limit) break;
      const right = (xAt(i + 1) - f.x0) * f.sx;
      if (right - left >= 1) {
        flush();
        const y = f.h - values[i] * f.sy;
        point(left, y);
        point(right, y);
        continue;
      }
      const col = Math.floor(left);
      if (col !== column) {
        flush();
        column = col;
        columnMax = values[i];
      } else if (values[i] > columnMax) {
        columnMax = values[i];
      }
    }
    flush();
    ctx.stroke();
    ctx.setLineDash([]);
  },

  vline(ctx, position, color, label, dash) {
    const p = this.plot;
    const x = this.pxOfX(this.xAt(Math.min(position, this.positions - 1)), p);
    if (x < p.x || x > p.x + p.w) return;
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.2;
    ctx.setLineDash(dash);
    ctx.beginPath();
    ctx.moveTo(x + 0.5, p.y);
    ctx.lineTo(x + 0.5, p.y + p.h);
    ctx.stroke();
    ctx.setLineDash([]);
    if (label) {
      ctx.font = '11px system-ui, sans-serif';
      ctx.textAlign = 'left';
      ctx.textBaseline = 'alphabetic';
      const width = ctx.measureText(label).width;
      const lx = x + 5 + width > p.x + p.w ? x - 5 - width : x + 5;
      ctx.fillStyle = 'rgba(255, 255, 255, 0.85)';
      ctx.fillRect(lx - 2, p.y + 1, width + 4, 13);
      ctx.fillStyle = color;
      ctx.fillText(label, lx, p.y + 11);
    }
  },

  // record_function scopes: bars along the bottom of the plot (nested ones above), named where
  // there is room.
  spanBox(span, p = this.plot) {
    const left = Math.max(p.x, this.pxOfX(this.xAt(span.x0), p));
    const right = Math.min(p.x + p.w, this.pxOfX(this.xAt(Math.min(span.x1, this.positions)), p));
    return { left, right, top: p.y + p.h - 7 - span.depth * 7, height: 5 };
  },

  drawSpans(ctx, p) {
    const spans = this.data.meta.spans || [];
    ctx.font = '10px system-ui, sans-serif';
    ctx.textBaseline = 'bottom';
    for (const span of spans) {
      const b = this.spanBox(span, p);
      if (b.right < p.x || b.left > p.x + p.w) continue;
      ctx.fillStyle = 'rgba(122, 82, 0, 0.75)';
      ctx.fillRect(b.left, b.top, Math.max(b.right - b.left, 1), b.height);
      if (b.right - b.left > 90 && span.depth === 0) {
        ctx.fillStyle = '#5c3d00';
        ctx.fillText(span.name, b.left + 2, b.top - 1, b.right - b.left - 4);
      }
    }
    ctx.textBaseline = 'alphabetic';
  },

  spanAt(px, py) {
    const p = this.plot;
    for (const span of this.data.meta.spans || []) {
      const b = this.spanBox(span, p);
      if (px >= b.left - 1 && px <= b.right + 1 && py >= b.top - 1 && py <= b.top + b.height + 1) return span;
    }
    return null;
  },

  marker(ctx, m) {
    if (m.text.startsWith('out of memory')) return this.vline(ctx, m.x, '#a3261b', 'OOM', [2, 2]);
    const p = this.plot;
    const x = this.pxOfX(this.xAt(Math.min(m.x, this.positions - 1)), p);
    if (x < p.x || x > p.x + p.w) return;
    ctx.fillStyle = '#7a5200';
    ctx.beginPath();
    ctx.moveTo(x - 4, p.y);
    ctx.lineTo(x + 4, p.y);
    ctx.lineTo(x, p.y + 6);
    ctx.fill();
  },

  drawAxes(ctx, p, ymax) {
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = '#667085';
    ctx.strokeStyle = '#eceef2';
    ctx.lineWidth = 1;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (const v of ticks(0, ymax / HEADROOM, 5, true)) {
      const y = Math.round(p.y + p.h - (v / ymax) * p.h) + 0.5;
      ctx.beginPath();
      ctx.moveTo(p.x, y);
      ctx.lineTo(p.x + p.w, y);
      ctx.stroke();
      ctx.fillText(formatBytes(v), p.x - 6, y);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const [v0, v1] = this.view;
    // Event ticks name events: event e is the step from position e to e + 1.
    const shift = this.axis === 'time' ? 0 : 1;
    for (const v of ticks(v0 - shift, v1 - shift, Math.max(2, Math.floor(p.w / 110)), false)) {
      const x = this.pxOfX(v + shift, p);
      if (x < p.x - 1 || x > p.x + p.w + 1 || v < 0) continue;
      ctx.fillText(this.axis === 'time' ? formatTime(v) : String(Math.round(v)), x, p.y + p.h + 8);
    }
    ctx.textBaseline = 'alphabetic';
    ctx.strokeStyle = '#c9ced8';
    ctx.strokeRect(p.x + 0.5, p.y + 0.5, p.w, p.h);
  },
};
