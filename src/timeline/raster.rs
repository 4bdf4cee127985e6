//! Rasterises a timeline's bands into RGBA pixels, for the page's worker (the main thread only
//! copies the image into place, whatever the trace size).
//!
//! An allocation's pieces that fall in one pixel column (or sit side by side at one height)
//! become one rectangle covering them all. Bands of a pixel or more get the pixels whose centres
//! they cover (each its true share); slivers smaller than a pixel fill what no full band covers,
//! so the picture never shows empty space where memory was live.

use super::Timeline;

/// One image to draw: the x range (in axis units: event positions, or microseconds), its size in
/// pixels, the byte height of the top row, and the colours (RGBA words, red in the low byte).
pub struct Raster<'a> {
    /// Axis coordinate of every position, one past the end included (`events + 2` values);
    /// empty: the event axis, where a position is its own coordinate.
    pub xs: &'a [f64],
    pub x0: f64,
    pub x1: f64,
    pub width: usize,
    pub height: usize,
    pub ymax: f64,
    /// Groups in drawing order, and each group's colour.
    pub group_order: &'a [u32],
    pub group_color: &'a [u32],
    /// Allocations drawn as ghosts (filtered out or hidden by the legend): 1 = hidden. Empty:
    /// none hidden.
    pub hidden: &'a [u8],
    pub ghost: u32,
}

/// The image, `width * height` RGBA words, row 0 at the top; transparent where nothing is live.
pub fn rasterize(t: &Timeline, r: &Raster) -> Vec<u32> {
    let (width, height) = (r.width, r.height);
    let mut pixels = vec![0u32; width * height];
    if width == 0 || height == 0 || r.x1 <= r.x0 || r.ymax <= 0.0 || (!r.xs.is_empty() && r.xs.len() < t.events + 2) {
        return pixels;
    }
    let sx = width as f64 / (r.x1 - r.x0);
    let sy = height as f64 / r.ymax;
    // A pixel belongs to the rectangle that covers its centre, so bands at least a pixel tall and
    // wide tile the image exactly, each with its true share of pixels. Rectangles smaller than a
    // pixel either way cover no centre reliably: they are kept for a second pass that gives each
    // the pixels it touches but only where no full-size band lies, the biggest (bytes x time)
    // last, so a sliver never paints over what holds most of a pixel, yet never vanishes into
    // empty space either.
    let span = |lo: f64, hi: f64, limit: usize| -> (usize, usize) {
        let a = (lo.round().max(0.0) as usize).min(limit);
        let b = (hi.round().max(0.0) as usize).min(limit);
        (a, b)
    };
    // Pixel coordinates as f32 (a canvas is at most 32767 pixels wide): at full zoom a 1 M event
    // trace has hundreds of thousands of slivers.
    let mut small: Vec<(f32, u32, f32, f32, f32, f32)> = Vec::new();
    let mut draw = |color: u32, l: f64, r: f64, t: f64, b: f64| {
        let (c0, c1) = span(l, r, width);
        let (r0, r1) = span(t, b, height);
        if c1 > c0 && r1 > r0 {
            for row in r0..r1 {
                pixels[row * width + c0..row * width + c1].fill(color);
            }
        } else {
            small.push((((r - l) * (b - t)) as f32, color, l as f32, r as f32, t as f32, b as f32));
        }
    };
    let x_at = |position: u32| if r.xs.is_empty() { position as f64 } else { r.xs[position as usize] };
    let a = &t.allocations;
    for &g in r.group_order {
        let g = g as usize;
        // The page names groups by index: one this trace lacks is skipped, not a panic.
        let (Some(&group_color), Some(&[start, end])) = (r.group_color.get(g), a.group_start.get(g..g + 2)) else { continue };
        for &id in &a.by_group[start as usize..end as usize] {
            let size = a.size[id as usize];
            let hidden = r.hidden.get(id as usize).is_some_and(|&h| h != 0);
            let color = if hidden { r.ghost } else { group_color };
            // The rectangle being grown: (l, r, t, b).
            let mut current: Option<(f64, f64, f64, f64)> = None;
            for p in t.pieces(id) {
                let (xa, xb) = (x_at(p.x0), x_at(p.x1));
                if xb < r.x0 || xa > r.x1 {
                    continue;
                }
                let (l, rr) = ((xa - r.x0) * sx, (xb - r.x0) * sx);
                let top = height as f64 - (p.y + size) * sy;
                let bottom = top + size * sy;
                // Merge into the current rectangle: the next piece at the same height, or, while
                // the rectangle is narrower than a pixel, the next piece that ends in the same column.
                if let Some((cl, cr, ct, cb)) = current.as_mut()
                    && l - *cr < 1.0
                    && ((top == *ct && bottom == *cb) || (*cr - *cl < 1.0 && rr <= cl.floor() + 1.0))
                {
                    *cr = cr.max(rr);
                    *ct = ct.min(top);
                    *cb = cb.max(bottom);
                    continue;
                }
                if let Some((cl, cr, ct, cb)) = current {
                    draw(color, cl, cr, ct, cb);
                }
                current = Some((l, rr, top, bottom));
            }
            if let Some((cl, cr, ct, cb)) = current {
                draw(color, cl, cr, ct, cb);
            }
        }
    }
    // Each pixel left empty by the full bands goes to the biggest sliver touching it (no sort:
    // the biggest area seen so far is kept per pixel; full bands count as infinitely big).
    let mut best: Vec<f32> = pixels.iter().map(|&p| if p != 0 { f32::INFINITY } else { -1.0 }).collect();
    for (area, color, l, r, t, b) in small {
        let c0 = (l.floor().max(0.0) as usize).min(width - 1);
        let c1 = (r.ceil() as usize).clamp(c0 + 1, width);
        let r0 = (t.floor().max(0.0) as usize).min(height - 1);
        let r1 = (b.ceil() as usize).clamp(r0 + 1, height);
        for row in r0..r1 {
            for i in row * width + c0..row * width + c1 {
                if area > best[i] {
                    best[i] = area;
                    pixels[i] = color;
                }
            }
        }
    }
    pixels
}
