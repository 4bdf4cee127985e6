// What is live at the cursor as an icicle chart: the stacks of the live allocations merged from
// the outermost frame down, each frame as wide as the bytes allocated beneath it. Python frames
// only by default (the C++ frames of a PyTorch stack are the same dispatcher plumbing everywhere).
import { formatBytes } from './format.js';
import { prepareCanvas, textColorOn } from './canvas.js';

const ROW = 20;
const MAX_DEPTH = 28;

// items: [{bytes, frames: [[name, file, line], ...] innermost first, group, color}]; stacks with no
// Python frame (backward runs on the autograd engine's C++ thread) or none at all stand under
// their group's name.
export function buildTree(items, pythonOnly) {
  const root = { label: 'all live allocations', bytes: 0, children: new Map(), color: '#d5dae3' };
  for (const item of items) {
    root.bytes += item.bytes;
    let frames = pythonOnly ? item.frames.filter((f) => f[1].endsWith('.py')) : item.frames;
    if (!frames.length) frames = [[item.group, '', 0]];
    let node = root;
    for (let k = frames.length - 1; k >= 0; k--) {
      const f = frames[k];
      const key = `${f[0]}\u0000${f[1]}\u0000${f[2]}`;
      let child = node.children.get(key);
      if (!child) {
        const file = f[1].split('/').slice(-2).join('/');
        child = { label: f[1] && f[1] !== '??' ? `${f[0]} (${file}:${f[2]})` : f[0], bytes: 0, children: new Map(), color: item.color };
        node.children.set(key, child);
      }
      child.bytes += item.bytes;
      node = child;
    }
  }
  return root;
}

export class Icicle {
  constructor(canvas, tooltip) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.root = null;
    this.focus = null;
    this.boxes = [];
    canvas.addEventListener('pointermove', (e) => this.hover(e));
    canvas.addEventListener('pointerleave', () => { this.tooltip.hidden = true; });
    canvas.addEventListener('click', (e) => {
      const box = this.at(e);
      // Clicking a frame zooms to it; clicking the top row goes back up.
      this.focus = box && box.node !== this.focus ? box.node : (this.parentOf(this.focus) || this.root);
      this.draw();
    });
  }

  setTree(root) {
    this.root = root;
    this.focus = root;
    // A tooltip about the old tree would name what is no longer drawn.
    this.tooltip.hidden = true;
    this.draw();
  }

  parentOf(target, node = this.root) {
    if (!node || !target) return null;
    for (const child of node.children.values()) {
      if (child === target) return node;
      const found = this.parentOf(target, child);
      if (found) return found;
    }
    return null;
  }

  // Boxes for every node at least half a pixel wide, from the focused node down.
  layout(width) {
    const boxes = [];
    const place = (node, x, w, depth) => {
      if (depth >= MAX_DEPTH || w < 0.5) return;
      boxes.push({ node, x, y: depth * ROW, w });
      let at = x;
      for (const child of [...node.children.values()].sort((p, q) => q.bytes - p.bytes)) {
        const cw = (child.bytes / node.bytes) * w;
        place(child, at, cw, depth + 1);
        at += cw;
      }
    };
    if (this.focus && this.focus.bytes > 0) place(this.focus, 0, width, 0);
    return boxes;
  }

  draw() {
    const c = this.canvas;
    this.boxes = this.layout(c.clientWidth || c.parentElement.clientWidth);
    const { ctx } = prepareCanvas(c, Math.max(ROW, ...this.boxes.map((b) => b.y + ROW)));
    for (const { node, x, y, w } of this.boxes) {
      ctx.fillStyle = node.color;
      ctx.fillRect(x + 0.5, y + 0.5, Math.max(w - 1, 0.5), ROW - 1);
      if (w > 40) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(x, y, w - 2, ROW);
        ctx.clip();
        ctx.fillStyle = textColorOn(ctx, node.color);
        ctx.fillText(`${node.label} · ${formatBytes(node.bytes)}`, x + 4, y + ROW / 2);
        ctx.restore();
      }
    }
  }

  at(e) {
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left;
    const y = e.clientY - r.top;
    return this.boxes.find((b) => x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + ROW) || null;
  }

  hover(e) {
    const box = this.at(e);
    if (!box) { this.tooltip.hidden = true; return; }
    const share = this.root.bytes ? ((box.node.bytes / this.root.bytes) * 100).toFixed(1) : '0';
    this.tooltip.textContent = `${box.node.label}: ${formatBytes(box.node.bytes)} (${share}% of live bytes)`;
    this.tooltip.hidden = false;
    const r = this.canvas.parentElement.getBoundingClientRect();
    const x = e.clientX - r.left;
    this.tooltip.style.left = `${Math.min(x + 12, r.width - this.tooltip.offsetWidth - 4)}px`;
    this.tooltip.style.top = `${e.clientY - r.top + 14}px`;
  }
}
