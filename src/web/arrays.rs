//! A device's timeline as the page draws it: flat typed arrays (bands, pieces, curves), the
//! hit test, and the bands' colouring by recorded or inferred category or by frame.

use crate::doctor;
use crate::timeline::kept::{self, InferredCategories};
use crate::timeline::{Grouping, Timeline};
use crate::trace::Snapshot;
use std::rc::Rc;
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
pub struct TimelineArrays {
    /// Shared with the doctor while it reads the trace ([`TimelineArrays::laid_out`]).
    t: Rc<Timeline>,
    /// The snapshot it was laid out from (compared, never read: see [`LaidOut`]).
    of: *const Snapshot,
    /// Axis coordinate of every position (microseconds), set by the page; empty for the event axis.
    xs: Vec<f64>,
    /// The last image's hidden allocations (1 = hidden), for `hit_test`.
    hidden: Vec<u8>,
    /// What the bands are coloured by now ([`RECORDED`], [`INFERRED`] or [`FRAME`]), and how the
    /// trace itself groups them (recorded categories, or frames).
    color: &'static str,
    base_color: &'static str,
    /// The trace's own grouping while another is shown.
    base: Option<Grouping>,
    /// Each allocation's inferred category, once inferred.
    inferred: Option<InferredCategories>,
}

/// A laid-out timeline handed to the doctor (see [`TimelineArrays::laid_out`]). Passed by value,
/// so that no borrow of the page's timeline outlives a finder's panic.
#[wasm_bindgen]
pub struct LaidOut {
    t: Rc<Timeline>,
    of: *const Snapshot,
}

impl LaidOut {
    /// The timeline, if it was laid out from `snapshot` (the page names views by trace; this
    /// holds whatever it names).
    pub(super) fn timeline_of(&self, snapshot: &Snapshot) -> Option<&Timeline> {
        std::ptr::eq(self.of, snapshot).then_some(&*self.t)
    }
}

/// The bands coloured by the categories the trace records (tensormem's own traces).
const RECORDED: &str = "recorded";
/// By the doctor's inferred categories (see `doctor::infer`).
const INFERRED: &str = "inferred";
/// By the top user frame of each allocation's stack.
const FRAME: &str = "frame";

// Each array goes straight from wasm memory into a new JS typed array (no Rust-side copy: a
// 1 M-event trace has millions of pieces).
macro_rules! copy {
    ($($name:ident: $js:ident = $($field:ident).+;)*) => {
        #[wasm_bindgen]
        impl TimelineArrays {
            $(pub fn $name(&self) -> js_sys::$js { js_sys::$js::from(&self.t.$($field).+[..]) })*
        }
    };
}

copy! {
    alloc_size: Float64Array = allocations.size;
    alloc_addr: Float64Array = allocations.addr;
    alloc_stream: Float64Array = allocations.stream;
    alloc_start: Uint32Array = allocations.start;
    alloc_end: Uint32Array = allocations.end;
    alloc_stack: Uint32Array = allocations.stack;
    alloc_group: Uint32Array = allocations.group;
    stack_offsets: Uint32Array = stack_offsets;
    stack_frames: Uint32Array = stack_frames;
    scope_offsets: Uint32Array = scope_offsets;
    scope_frames: Uint32Array = scope_frames;
    piece_offsets: Uint32Array = allocations.piece_offsets;
    piece_x0: Uint32Array = pieces.x0;
    piece_y: Float32Array = pieces.y;
}

#[wasm_bindgen]
impl TimelineArrays {
    /// Trace entries; positions run from 0 to `events` inclusive.
    pub fn events(&self) -> u32 {
        self.t.events as u32
    }

    /// The x axis: the coordinate of every position and one past the end (`events + 2` values),
    /// or none for the event axis (a position is its own coordinate).
    pub fn set_axis(&mut self, xs: Vec<f64>) {
        self.xs = xs;
    }

    /// The bands of `[x0, x1)` (axis units) as `width x height` RGBA words; see
    /// `timeline::raster`. `hidden[alloc] = 1` draws that allocation as a ghost.
    #[allow(clippy::too_many_arguments)]
    pub fn raster(
        &mut self,
        x0: f64,
        x1: f64,
        width: u32,
        height: u32,
        ymax: f64,
        group_order: Vec<u32>,
        group_color: Vec<u32>,
        hidden: Vec<u8>,
        ghost: u32,
    ) -> Result<Vec<u32>, JsError> {
        // A canvas is at most 32767 pixels a side and 268 M pixels in Chromium; anything larger
        // is a bug in the caller, said as such rather than an abort on allocation.
        if (width as u64) * (height as u64) > 1 << 28 {
            return Err(JsError::new(&format!("an image of {width} x {height} pixels is larger than any canvas")));
        }
        // Kept for `hit_test`: what is hidden is what the page shows as ghosts.
        self.hidden = hidden;
        let r = crate::timeline::raster::Raster {
            xs: &self.xs,
            x0,
            x1,
            width: width as usize,
            height: height as usize,
            ymax,
            group_order: &group_order,
            group_color: &group_color,
            hidden: &self.hidden,
            ghost,
        };
        Ok(crate::timeline::raster::rasterize(&self.t, &r))
    }

    /// The allocation under the pointer (position, height in bytes, slack in bytes), skipping
    /// those hidden in the last image; `undefined` for none. See `Timeline::hit_test`.
    pub fn hit_test(&self, pos: u32, bytes: f64, slack: f64) -> Option<u32> {
        self.t.hit_test(pos, bytes, slack, &self.hidden)
    }

    /// The allocations live at position `pos`, bottom of the stack first, as `[id, bottom]`
    /// pairs (bottom: bytes below its band), skipping those hidden in the last image; what the
    /// page's keyboard steps through. See `Timeline::stack_at`.
    pub fn stack_at(&self, pos: u32) -> Vec<f64> {
        self.t.stack_at(pos, &self.hidden).into_iter().flat_map(|(id, y)| [id as f64, y]).collect()
    }

    /// An allocation's rectangles as `[x0, x1, y]` triples, to outline it.
    pub fn pieces_of(&self, alloc: u32) -> Vec<f64> {
        self.t.pieces_of(alloc)
    }
}

#[wasm_bindgen]
impl TimelineArrays {
    /// `{summary, groups: [{name, kind, category, bytes_at_peak, allocations}], base_groups,
    /// markers, spans, frames: [[name, filename, line], ...]}`. A group's `kind` (`frame`,
    /// `before_trace`, `no_stack`, a category's key, or `unknown`) is what code matches; its
    /// `name` is for people. `groups` colour the bands now; `base_groups` are the trace's own
    /// grouping (recorded categories, or frames) when another is shown, else null.
    pub fn meta_json(&self) -> String {
        let frames: Vec<(&str, &str, u64)> = self.t.frames.iter().map(|f| (f.name.as_str(), f.filename.as_str(), f.line)).collect();
        serde_json::json!({
            "summary": self.t.summary,
            "groups": self.t.groups,
            "base_groups": self.base.as_ref().map(|b| &b.groups),
            "markers": self.t.markers,
            "spans": self.t.spans,
            "frames": frames,
        })
        .to_string()
    }

    /// Whether the bands were laid out for a first image only (a sample per pixel column); see
    /// [`TimelineArrays::lay_full_bands`].
    pub fn bands_for_first_image(&self) -> bool {
        self.t.bands_for_width.is_some()
    }

    /// Lays the bands out fully where they were laid out for a first image: the pieces
    /// (`piece_*`) and the warnings (`summary_warnings_json`) change. False when they were
    /// laid out fully already.
    pub fn lay_full_bands(&mut self) -> bool {
        if self.t.bands_for_width.is_none() {
            return false;
        }
        // The doctor's share of the timeline is given back when it is done (after a finder's
        // panic it never is, and this copies the timeline once: see `laid_out`).
        Rc::make_mut(&mut self.t).lay_full_bands();
        true
    }

    /// The summary's warnings (as in `meta_json`).
    pub fn summary_warnings_json(&self) -> String {
        serde_json::to_string(&self.t.summary.warnings).unwrap_or_default()
    }

    /// The groups colouring the bands now (as in `meta_json`), after [`TimelineArrays::set_color_by`].
    pub fn groups_json(&self) -> String {
        serde_json::to_string(&self.t.groups).unwrap_or_default()
    }

    /// What the bands can be coloured by, the default first: `recorded` (the trace's own
    /// categories, where it records them), `inferred` (the doctor's inferred categories), `frame`.
    pub fn color_options(&self) -> Vec<String> {
        let options: &[&str] = if self.base_color == RECORDED { &[RECORDED, INFERRED, FRAME] } else { &[INFERRED, FRAME] };
        options.iter().map(|o| o.to_string()).collect()
    }

    pub fn color_by(&self) -> String {
        self.color.to_string()
    }

    /// Colours the bands by `by` (one of [`TimelineArrays::color_options`]): the groups and
    /// `alloc_group` change (read them again); inferring the categories the first time.
    pub fn set_color_by(&mut self, by: &str) -> Result<(), JsError> {
        if by == self.color {
            return Ok(());
        }
        let (by, grouping) = match by {
            _ if by == self.base_color => (self.base_color, self.base.take().unwrap_or_default()),
            INFERRED => (INFERRED, doctor::grouping(&self.inferred_codes().category)),
            FRAME => (FRAME, self.t.frame_grouping()),
            _ => return Err(JsError::new(&format!("the bands cannot be coloured by {by}: {}", self.color_options().join(", ")))),
        };
        // Cloned only while the doctor still holds it (after a finder's panic, which wasm does
        // not unwind, it holds it for good).
        let old = Rc::make_mut(&mut self.t).set_grouping(grouping);
        if self.color == self.base_color {
            self.base = Some(old);
        }
        self.color = by;
        Ok(())
    }

    /// The timeline for the doctor to read (`LoadedTrace::diagnose_laid_out`) instead of laying
    /// it out again; undefined while the bands are coloured other than as the trace groups them
    /// (recorded categories, or frames: the doctor reads its own grouping).
    pub fn laid_out(&self) -> Option<LaidOut> {
        (self.color == self.base_color).then(|| LaidOut { t: Rc::clone(&self.t), of: self.of })
    }

    /// Each allocation's inferred category (inferred the first time), as three Uint8Arrays by
    /// allocation id: `[category, confidence, reason]`, indices into `inferred_names_json`'s lists.
    pub fn inferred(&mut self) -> js_sys::Array {
        let codes = self.inferred_codes();
        [&codes.category, &codes.confidence, &codes.reason].into_iter().map(|v| js_sys::Uint8Array::from(&v[..])).collect()
    }

    /// A timeline of `device` read back from a layout kept by `LoadedTrace::keep_layout` for
    /// the file `key` names, before that file's trace is read back: it draws and answers
    /// hovers, and reads its trace once [`TimelineArrays::attach`]ed to it. An error if the bytes
    /// are not that, whole, or not of that device.
    pub fn from_kept(device: i32, bytes: &[u8], key: &str) -> Result<TimelineArrays, JsError> {
        let kept = kept::decode(bytes, &super::source_key(key)?).map_err(super::js_error)?;
        let t = &kept.timeline;
        let inferred_ok = kept.inferred.as_ref().is_none_or(|i| {
            i.category.len() == t.allocations.size.len()
                && i.category.iter().all(|&c| (c as usize) < doctor::CATEGORIES.len())
                && i.confidence.iter().all(|&c| c < 3)
                && i.reason.iter().all(|&r| (r as usize) < i.reasons.len())
        });
        if t.device != device as i64 || !inferred_ok {
            return Err(JsError::new("the layout kept is not of this device"));
        }
        Ok(TimelineArrays { inferred: kept.inferred, ..TimelineArrays::new(kept.timeline, std::ptr::null()) })
    }

    /// `[peak_x, peak_allocated, start_allocated, start_reserved, final_allocated,
    /// final_reserved]` (bytes) from its summary: what its curves must show where it says.
    pub fn curve_figures(&self) -> Vec<f64> {
        let s = &self.t.summary;
        [s.peak_x as u64, s.peak_allocated_bytes, s.start_allocated_bytes, s.start_reserved_bytes, s.final_allocated_bytes, s.final_reserved_bytes]
            .map(|v| v as f64)
            .to_vec()
    }

    /// Ties a timeline read back from its layout kept to the trace it was laid out from, once
    /// read back (the doctor then reads this timeline instead of laying the trace out again).
    /// False, and left untied, if `trace` is not of its length.
    pub fn attach(&mut self, trace: &super::LoadedTrace) -> bool {
        let snapshot = &trace.snapshot;
        let fits = snapshot.trace_of(self.t.device).len() == self.t.events;
        if fits {
            self.of = snapshot;
        }
        fits
    }

    /// `{categories: ["parameter", ..., "unknown"], confidences: ["low", "medium", "high"],
    /// reasons: [...]}`: what `inferred`'s codes stand for (reasons once inferred).
    pub fn inferred_names_json(&self) -> String {
        let confidences = [doctor::Confidence::Low, doctor::Confidence::Medium, doctor::Confidence::High].map(doctor::Confidence::name);
        let reasons = self.inferred.as_ref().map_or(&[][..], |c| &c.reasons[..]);
        serde_json::json!({ "categories": doctor::CATEGORIES, "confidences": confidences, "reasons": reasons }).to_string()
    }
}

impl TimelineArrays {
    /// The bands coloured as the trace groups them: by its own categories where it records
    /// them, else by frame.
    pub(super) fn new(t: Timeline, of: *const Snapshot) -> TimelineArrays {
        let base = if t.groups.iter().any(|g| g.category) { RECORDED } else { FRAME };
        TimelineArrays { t: Rc::new(t), of, xs: Vec::new(), hidden: Vec::new(), color: base, base_color: base, base: None, inferred: None }
    }

    /// What `LoadedTrace::keep_layout` keeps of this view beside its layout: the trace's own
    /// grouping and the categories inferred so far.
    pub(super) fn to_keep(&self) -> kept::Keep<'_> {
        kept::Keep { base: self.base.as_ref(), inferred: self.inferred.as_ref() }
    }

    pub(super) fn timeline(&self) -> &Timeline {
        &self.t
    }

    fn inferred_codes(&mut self) -> &InferredCategories {
        self.inferred.get_or_insert_with(|| doctor::infer_codes(&self.t))
    }
}
