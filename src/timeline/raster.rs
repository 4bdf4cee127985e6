//! Rasterises a timeline's bands into RGBA pixels, for the page's worker (the main thread only
//! copies the image into place, whatever the trace size).
//!
//! Every allocation covers at least one pixel: an allocation's pieces that fall in one pixel
//! column (or sit side by side at one height) become one rectangle covering them all, so detail
//! smaller than a pixel is aggregated, never dropped.

use super::Timeline;

/// One image to draw: the x range (in axis units: event positions, or microseconds), its size in
/// pixels, the byte height of the top row, and the colours (RGBA words, red in the low byte).
pub struct Raster<'a> {
    /// Axis coordinate of every position, one past the end included (`events + 2` values).
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
    if width == 0 || height == 0 || r.x1 <= r.x0 || r.ymax <= 0.0 || r.xs.len() < t.events + 2 {
        return pixels;
    }
    let sx = width as f64 / (r.x1 - r.x0);
    let sy = height as f64 / r.ymax;
    let mut fill = |color: u32, left: f64, right: f64, top: f64, bottom: f64| {
        // Every pixel the rectangle touches (conservative: neighbours may share an edge pixel,
        // the one drawn later wins it).
        let c0 = left.floor();
        let c1 = right.ceil().max(c0 + 1.0).min(width as f64);
        let r0 = top.floor();
        let r1 = bottom.ceil().max(r0 + 1.0).min(height as f64);
        let (c0, r0) = (c0.max(0.0) as usize, r0.max(0.0) as usize);
        let (c1, r1) = (c1.max(0.0) as usize, r1.max(0.0) as usize);
        if c0 >= c1 {
            return;
        }
        for row in r0..r1 {
            pixels[row * width + c0..row * width + c1].fill(color);
        }
    };
    // Rectangles thinner or narrower than a pixel are drawn last, on top of the big ones, so a
    // short-lived or tiny allocation is not painted over by its neighbours.
    let mut small: Vec<(u32, f64, f64, f64, f64)> = Vec::new();
    let mut draw = |fill: &mut dyn FnMut(u32, f64, f64, f64, f64), color: u32, l: f64, r: f64, t: f64, b: f64| {
        if r - l < 1.0 || b - t < 1.0 {
            small.push((color, l, r, t, b));
        } else {
            fill(color, l, r, t, b);
        }
    };
    let p = &t.pieces;
    let sizes = &t.allocations.size;
    for &g in r.group_order {
        let g = g as usize;
        let Some(&group_color) = r.group_color.get(g) else { continue };
        let (start, end) = (p.group_start[g] as usize, p.group_start[g + 1] as usize);
        // The rectangle being grown for the current allocation: (alloc, colour, l, r, t, b).
        let mut current: Option<(u32, u32, f64, f64, f64, f64)> = None;
        for i in start..end {
            let xa = r.xs[p.x0[i] as usize];
            let xb = r.xs[p.x1[i] as usize];
            if xb < r.x0 || xa > r.x1 {
                continue;
            }
            let id = p.alloc[i];
            let size = sizes[id as usize];
            let (l, rr) = ((xa - r.x0) * sx, (xb - r.x0) * sx);
            let top = height as f64 - (p.y[i] + size) * sy;
            let bottom = top + size * sy;
            // Merge into the current rectangle: the next piece at the same height, or, while the
            // rectangle is narrower than a pixel, the next piece that ends in the same column.
            if let Some((alloc, _, cl, cr, ct, cb)) = current.as_mut()
                && *alloc == id
                && l - *cr < 1.0
                && ((top == *ct && bottom == *cb) || (*cr - *cl < 1.0 && rr <= cl.floor() + 1.0))
            {
                *cr = cr.max(rr);
                *ct = ct.min(top);
                *cb = cb.max(bottom);
                continue;
            }
            if let Some((_, color, cl, cr, ct, cb)) = current {
                draw(&mut fill, color, cl, cr, ct, cb);
            }
            let hidden = r.hidden.get(id as usize).is_some_and(|&h| h != 0);
            current = Some((id, if hidden { r.ghost } else { group_color }, l, rr, top, bottom));
        }
        if let Some((_, color, cl, cr, ct, cb)) = current {
            draw(&mut fill, color, cl, cr, ct, cb);
        }
    }
    for (color, l, r, t, b) in small {
        fill(color, l, r, t, b);
    }
    pixels
}
