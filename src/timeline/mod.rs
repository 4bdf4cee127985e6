//! The page's model of one device's trace: every allocation as a band stacked as MemoryViz stacks
//! them, the allocated and reserved curves, markers and warnings. Pure data (flat arrays ready to
//! hand to JavaScript as typed arrays); tested natively.
//!
//! The x axis counts positions: x = 0 is the state at the start of the trace (rebuilt from the
//! final segments, as replay does), x = i + 1 the state after event i. An allocation lives over
//! `[start, end)`. Live allocations are stacked in the order they were made; when one is freed,
//! everything above it drops by its size, so a band is a run of rectangles ("pieces"), one per
//! height it held. The top of the stack is the allocated curve, in requested bytes as MemoryViz
//! and `tensormem replay`'s recorded figures count them.

pub mod kept;
mod notes;
pub mod raster;
mod stacking;

use crate::pytorch::{group_name, module_scope};
use crate::replay::{self, StartState, recorded_config, start_state};
use crate::trace::{Action, BlockState, Category, Frame, Frames, Snapshot, Totals, Trace};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// One device's trace, laid out for drawing.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub device: i64,
    /// Trace entries; positions run from 0 to `events` inclusive.
    pub events: usize,
    /// Requested bytes live at each position (the top of the stack). The three curves are empty
    /// when built without them ([`build_without_curves`]; [`curves`] gives them one by one).
    pub allocated: Vec<f64>,
    /// Reserved bytes (segments) at each position.
    pub reserved: Vec<f64>,
    /// Microseconds at each position (the event's `time_us`; NaN where the trace has none).
    pub time_us: Vec<f64>,
    pub allocations: Allocations,
    pub pieces: Pieces,
    /// Distinct frames, and each stack as a run of frame indices (innermost first).
    pub frames: Vec<Frame>,
    pub stack_offsets: Vec<u32>,
    pub stack_frames: Vec<u32>,
    /// Each stack's module scope (see [`crate::pytorch::module_scope`]) as frame indices, innermost first:
    /// stack `s` has `scope_frames[scope_offsets[s] .. scope_offsets[s + 1]]`.
    pub scope_offsets: Vec<u32>,
    pub scope_frames: Vec<u32>,
    /// Groups (what a band is coloured by): the allocation's category where the trace names one
    /// (tensormem's own traces), otherwise the top user frame of its stack.
    pub groups: Vec<Group>,
    pub markers: Vec<Marker>,
    /// `record_function` ranges (the snapshot's external annotations) placed on the positions.
    pub spans: Vec<Span>,
    pub summary: TimelineSummary,
    /// The bands were laid out a sample per pixel column of an image this wide, for a first image
    /// sooner ([`build_for_first_image_from`]); [`Timeline::lay_full_bands`] lays them out fully.
    pub bands_for_width: Option<u32>,
}

/// A named range of positions: a `record_function` scope from START to END, nested `depth` deep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub x0: u32,
    pub x1: u32,
    pub depth: u32,
    pub name: String,
}

/// Struct-of-arrays over allocations, indexed by allocation id.
#[derive(Debug, Clone, Default)]
pub struct Allocations {
    pub size: Vec<f64>,
    pub addr: Vec<f64>,
    pub stream: Vec<f64>,
    pub start: Vec<u32>,
    /// Exclusive; `events + 1` for allocations still live at the end.
    pub end: Vec<u32>,
    /// Index into the stack table; `u32::MAX` without frames.
    pub stack: Vec<u32>,
    pub group: Vec<u32>,
    /// Allocation `id`'s pieces are `pieces[piece_offsets[id] .. piece_offsets[id + 1]]`, in x
    /// order (see [`Timeline::piece_range`]).
    pub piece_offsets: Vec<u32>,
    /// Allocation ids by group (one colour to draw): group `g` has
    /// `by_group[group_start[g] .. group_start[g + 1]]`, in id order.
    pub by_group: Vec<u32>,
    pub group_start: Vec<u32>,
}

/// Struct-of-arrays over rectangles, by allocation, then x. An allocation's pieces tile its
/// lifetime, so a piece is only where it starts and its height: it ends where the allocation's
/// next piece starts, or where the allocation ends (a 1 M event trace has millions of pieces).
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    pub x0: Vec<u32>,
    /// Bytes below it (the bottom of its rectangle). A drawing coordinate, so f32 (its rounding,
    /// under 1e-7 of the height, is far below a pixel; the bytes themselves are in `allocations`).
    pub y: Vec<f32>,
}

/// One rectangle of an allocation's band: `[x0, x1) x [y, y + size)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Piece {
    pub x0: u32,
    pub x1: u32,
    pub y: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// For people: the frame (`step (optimizer.py:74)`), the category's label (`optimizer
    /// state`), or [`BEFORE_TRACE`] / [`NO_FRAMES`]. Code goes by `kind`.
    pub name: String,
    /// What the group is, as a stable key (the page colours groups by it).
    pub kind: GroupKind,
    /// Whether the group is a category (parameter, gradient, ...) rather than a frame.
    pub category: bool,
    /// Requested bytes of this group live at the peak of allocated memory.
    pub bytes_at_peak: u64,
    pub allocations: u32,
}

impl Group {
    /// An empty group (its counts are filled when the timeline indexes its groups).
    pub fn new(name: &str, kind: GroupKind) -> Group {
        let category = matches!(kind, GroupKind::Category(_) | GroupKind::Unknown);
        Group { name: name.to_string(), kind, category, bytes_at_peak: 0, allocations: 0 }
    }
}

/// What the bands are coloured by: the groups, and each allocation's (by allocation id).
#[derive(Debug, Clone, Default)]
pub struct Grouping {
    pub groups: Vec<Group>,
    pub group: Vec<u32>,
}

/// What a group is. Serialized as one string: `frame`, `before_trace`, `no_stack`, or the
/// category's snapshot key (`parameter`, `optimizer_state`, ...; see [`Category::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Allocations whose stacks share a top user frame (the group's name).
    Frame,
    /// Allocations live when the trace starts whose blocks carry no stack.
    BeforeTrace,
    /// Allocations recorded without a stack.
    NoStack,
    /// Allocations a trace (tensormem's own) says are of this category, or that the doctor
    /// infers are (see [`Timeline::set_grouping`]).
    Category(Category),
    /// Allocations the doctor's inference finds of no known category (torch.profiler's `unknown`).
    Unknown,
}

impl GroupKind {
    pub fn key(self) -> &'static str {
        match self {
            GroupKind::Frame => "frame",
            GroupKind::BeforeTrace => "before_trace",
            GroupKind::NoStack => "no_stack",
            GroupKind::Category(c) => c.name(),
            GroupKind::Unknown => "unknown",
        }
    }
}

impl Serialize for GroupKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.key())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    pub x: u32,
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelineSummary {
    pub device: i64,
    pub events: usize,
    pub allocations: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// First position where allocated memory reaches its peak.
    pub peak_x: u32,
    pub start_allocated_bytes: u64,
    pub start_reserved_bytes: u64,
    pub final_allocated_bytes: u64,
    pub final_reserved_bytes: u64,
    pub has_time: bool,
    /// How the times were taken, for traces tensormem recorded: "modelled on sim (H100-80GB)" or
    /// "wall clock on gpu (...)"; None for PyTorch's own (wall clock).
    pub time_source: Option<String>,
    pub settings: String,
    pub warnings: Vec<String>,
}

const NO_STACK: u32 = u32::MAX;

/// The group of allocations live at the start whose blocks carry no stack.
pub const BEFORE_TRACE: &str = "(allocated before the trace, no stack)";
/// The group of allocations recorded without a stack.
pub const NO_FRAMES: &str = "(no stack recorded)";

/// Lays out one device's trace. Fails only on a device the snapshot does not have or on settings
/// that cannot be parsed; a trace that does not add up still gets a timeline, with warnings.
impl Timeline {
    /// The allocation whose band covers height `bytes` at position `pos`, or failing that one
    /// within `slack` bytes of it (thin bands stay pointable); allocations with `hidden[id] != 0`
    /// are skipped. What the page's pointer is over.
    pub fn hit_test(&self, pos: u32, bytes: f64, slack: f64, hidden: &[u8]) -> Option<u32> {
        let a = &self.allocations;
        // (bottom, id) of the band holding `bytes`: where f32 heights let two bands overlap by a
        // rounding error, the upper one, whose bottom is the true boundary (on a tie, the later
        // allocation: live bands stack in the order they were made).
        let mut under: Option<(f64, u32)> = None;
        let mut near = None;
        for id in 0..a.size.len() {
            if a.start[id] > pos || a.end[id] <= pos || hidden.get(id).is_some_and(|&h| h != 0) {
                continue;
            }
            let range = self.piece_range(id);
            let first = range.start;
            let starts = &self.pieces.x0[range];
            // The pieces tile the allocation's lifetime, which covers `pos`: the last that
            // starts at or before it holds it.
            let Some(at) = starts.partition_point(|&x0| x0 <= pos).checked_sub(1) else { continue };
            let (y, size) = (self.pieces.y[first + at] as f64, a.size[id]);
            if bytes >= y && bytes < y + size {
                if under.is_none_or(|(bottom, _)| y >= bottom) {
                    under = Some((y, id as u32));
                }
            } else if bytes >= y - slack && bytes < y + size + slack {
                near = Some(id as u32);
            }
        }
        under.map(|(_, id)| id).or(near)
    }

    /// The allocations live at position `pos` with the bottom of each one's band there, from the
    /// bottom of the stack up (those with `hidden[id] != 0` left out): what the page's keyboard
    /// steps through. The bands [`Timeline::hit_test`] looks among.
    pub fn stack_at(&self, pos: u32, hidden: &[u8]) -> Vec<(u32, f64)> {
        let a = &self.allocations;
        let mut bands = Vec::new();
        for id in 0..a.size.len() {
            if a.start[id] > pos || a.end[id] <= pos || hidden.get(id).is_some_and(|&h| h != 0) {
                continue;
            }
            let range = self.piece_range(id);
            let first = range.start;
            if let Some(at) = self.pieces.x0[range].partition_point(|&x0| x0 <= pos).checked_sub(1) {
                bands.push((id as u32, self.pieces.y[first + at] as f64));
            }
        }
        // Live bands stack in the order they were made: a tie (a rounding error) goes by id.
        bands.sort_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)));
        bands
    }

    /// The curves of `trace` (this timeline's) at every position, from the totals at its start:
    /// what `allocated`, `reserved` and `time_us` hold when kept.
    pub fn curves<'t>(&self, trace: &'t Trace) -> impl Iterator<Item = CurvePoint> + 't {
        curves(trace, self.summary.start_allocated_bytes, self.summary.start_reserved_bytes)
    }

    /// Where allocation `id`'s pieces are in `pieces` (empty for an id the timeline lacks).
    pub fn piece_range(&self, id: usize) -> std::ops::Range<usize> {
        match self.allocations.piece_offsets.get(id..id + 2) {
            Some(&[first, end]) => first as usize..end as usize,
            _ => 0..0,
        }
    }

    /// An allocation's rectangles, in x order.
    pub fn pieces(&self, alloc: u32) -> impl Iterator<Item = Piece> + '_ {
        let id = alloc as usize;
        let range = self.piece_range(id);
        let last = range.end;
        range.map(move |k| Piece {
            x0: self.pieces.x0[k],
            x1: if k + 1 < last { self.pieces.x0[k + 1] } else { self.allocations.end[id] },
            y: self.pieces.y[k] as f64,
        })
    }

    /// An allocation's rectangles as `[x0, x1, y]` triples (positions, bytes).
    pub fn pieces_of(&self, alloc: u32) -> Vec<f64> {
        self.pieces(alloc).flat_map(|p| [p.x0 as f64, p.x1 as f64, p.y]).collect()
    }

    /// Colours the bands by another grouping (the doctor's inferred categories, or frames where
    /// the trace records categories): its groups' counts and the allocations by group are
    /// rebuilt. Returns the grouping it replaces.
    pub fn set_grouping(&mut self, grouping: Grouping) -> Grouping {
        assert_eq!(grouping.group.len(), self.allocations.size.len(), "a group for every allocation");
        let old =
            Grouping { groups: std::mem::replace(&mut self.groups, grouping.groups), group: std::mem::replace(&mut self.allocations.group, grouping.group) };
        self.index_groups(self.summary.peak_x);
        old
    }

    /// Each group's allocations and bytes live at `peak_x`, and the allocations by group.
    fn index_groups(&mut self, peak_x: u32) {
        let a = &mut self.allocations;
        for g in &mut self.groups {
            (g.allocations, g.bytes_at_peak) = (0, 0);
        }
        for i in 0..a.size.len() {
            let g = &mut self.groups[a.group[i] as usize];
            g.allocations += 1;
            if a.start[i] <= peak_x && peak_x < a.end[i] {
                g.bytes_at_peak += a.size[i] as u64;
            }
        }
        // Allocations by group (a counting sort).
        let mut group_start = vec![0u32; self.groups.len() + 1];
        for (g, group) in self.groups.iter().enumerate() {
            group_start[g + 1] = group_start[g] + group.allocations;
        }
        let mut fill = group_start.clone();
        a.by_group = vec![0; a.size.len()];
        for (id, &g) in a.group.iter().enumerate() {
            a.by_group[fill[g as usize] as usize] = id as u32;
            fill[g as usize] += 1;
        }
        a.group_start = group_start;
    }

    /// The grouping by the top user frame of each allocation's stack, whatever categories the
    /// trace records (what the builder gives a trace without them).
    pub fn frame_grouping(&self) -> Grouping {
        let mut groups: Vec<Group> = Vec::new();
        let mut new_group = |name: &str, kind: GroupKind| {
            groups.push(Group::new(name, kind));
            groups.len() as u32 - 1
        };
        let mut by_name: FxHashMap<String, u32> = FxHashMap::default();
        let stack_groups: Vec<Option<u32>> = (0..self.stack_offsets.len().saturating_sub(1))
            .map(|s| {
                let ids = &self.stack_frames[self.stack_offsets[s] as usize..self.stack_offsets[s + 1] as usize];
                let frames: Vec<Frame> = ids.iter().map(|&f| self.frames[f as usize].clone()).collect();
                let name = group_name(&frames)?;
                Some(*by_name.entry(name).or_insert_with_key(|name| new_group(name, GroupKind::Frame)))
            })
            .collect();
        // The groups without a stack, made when first needed.
        let (mut before, mut bare) = (None, None);
        let a = &self.allocations;
        let group = (0..a.size.len())
            .map(|id| match stack_groups.get(a.stack[id] as usize).copied().flatten() {
                Some(g) => g,
                None if a.start[id] == 0 => *before.get_or_insert_with(|| new_group(BEFORE_TRACE, GroupKind::BeforeTrace)),
                None => *bare.get_or_insert_with(|| new_group(NO_FRAMES, GroupKind::NoStack)),
            })
            .collect();
        Grouping { groups, group }
    }
}

/// How finely the bands are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bands {
    /// Not at all: each allocation's lifetime only.
    None,
    /// Exactly, or sampled where that would pass [`stacking::PIECE_BUDGET`].
    Full,
    /// A sample per pixel column of an image this wide.
    ForWidth(u32),
}

pub fn build(snapshot: &Snapshot, device: i64) -> Result<Timeline, replay::ReplayError> {
    build_with(snapshot, device, true, Bands::Full, None)
}

/// The timeline without its bands' pieces (each allocation's lifetime, stack and group, the
/// curves): what the analysis reads, in time and memory linear in the trace whatever the order
/// of its frees.
pub fn build_without_bands(snapshot: &Snapshot, device: i64) -> Result<Timeline, replay::ReplayError> {
    build_with(snapshot, device, true, Bands::None, None)
}

/// The timeline with neither its bands nor its curves, from a start state already reconstructed
/// (if it is this trace's): what the doctor reads (it walks the curves where it needs them, with
/// [`Timeline::curves`]), without holding 24 bytes a position.
pub fn build_lifetimes_from(snapshot: &Snapshot, device: i64, start: &replay::KnownStart) -> Result<Timeline, replay::ReplayError> {
    build_with(snapshot, device, false, Bands::None, Some(start))
}

/// The timeline without its three curves (8 bytes a position each): the page's worker hands them
/// to JavaScript straight from [`curves`], so that wasm memory never holds them beside the bands.
pub fn build_without_curves(snapshot: &Snapshot, device: i64) -> Result<Timeline, replay::ReplayError> {
    build_with(snapshot, device, false, Bands::Full, None)
}

/// [`build_without_curves`] from a start state already reconstructed (if it is this trace's).
pub fn build_without_curves_from(snapshot: &Snapshot, device: i64, start: &replay::KnownStart) -> Result<Timeline, replay::ReplayError> {
    build_with(snapshot, device, false, Bands::Full, Some(start))
}

/// [`build_without_curves_from`] with the bands sampled once per pixel column of an image
/// `width` pixels wide: the first image of a long trace, drawn before the full layout (which
/// [`Timeline::lay_full_bands`] adds). Everything but the bands' pieces is as laid out fully
/// (and the warning that the full layout adds where it samples the bands past its budget).
pub fn build_for_first_image_from(snapshot: &Snapshot, device: i64, start: &replay::KnownStart, width: u32) -> Result<Timeline, replay::ReplayError> {
    build_with(snapshot, device, false, Bands::ForWidth(width.max(1)), Some(start))
}

/// One position of the curves: requested bytes live, bytes reserved, and the time (NaN where
/// the trace has none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
    pub allocated: u64,
    pub reserved: u64,
    pub time_us: f64,
}

/// The curves at every position of `trace` (`trace.len() + 1` points), from the state at its
/// start: the running sums `tensormem replay` counts as recorded ([`Totals::apply`]). Position 0
/// takes the first time in the trace.
pub fn curves(trace: &Trace, start_allocated: u64, start_reserved: u64) -> impl Iterator<Item = CurvePoint> + '_ {
    let first_time = trace.times().flatten().next();
    let (actions, sizes) = (trace.actions(), trace.sizes());
    let mut at = Totals { allocated: start_allocated, reserved: start_reserved };
    // One index over the columns (not iterators zipped: in wasm their `next` stayed a call per
    // point, a tenth of the first image's layout). The running totals make the points valid in
    // order only: read them front to back.
    (0..trace.len() + 1).map(
        #[inline(always)]
        move |x| {
            let time = match x.checked_sub(1) {
                None => first_time,
                Some(i) => {
                    at.apply(actions[i], sizes[i]);
                    trace.time_at(i)
                }
            };
            CurvePoint { allocated: at.allocated, reserved: at.reserved, time_us: time.map_or(f64::NAN, |t| t as f64) }
        },
    )
}

fn build_with(snapshot: &Snapshot, device: i64, keep_curves: bool, bands: Bands, known: Option<&replay::KnownStart>) -> Result<Timeline, replay::ReplayError> {
    replay::check_device(snapshot, device)?;
    let config = recorded_config(snapshot)?;
    let trace = snapshot.trace_of(device);
    let reconstructed;
    let start = match known.and_then(|k| k.of_trace(snapshot, device)) {
        Some(start) => start,
        None => {
            let final_segments: Vec<_> = snapshot.segments_of(device).collect();
            reconstructed = start_state(&final_segments, trace, &config);
            &reconstructed
        }
    };
    let start_totals = Totals::of_segments(&start.segments);

    let mut b = Builder::new(device, trace, start, keep_curves);
    let curve = b.lay_curves(trace, start_totals, keep_curves);
    let mut warnings = start.warnings.clone();
    let any_frames = b.lay_events(trace, &mut warnings);
    let lifetimes = b.lay_lifetimes(start, trace);
    notes::trace_warnings(&mut warnings, start_totals, trace, &lifetimes, any_frames);
    b.t.spans = spans(snapshot, device, trace);
    b.finish_groups(curve.peak_x);
    b.t.summary = TimelineSummary {
        device,
        events: trace.len(),
        allocations: b.t.allocations.size.len(),
        peak_allocated_bytes: curve.peak.allocated,
        peak_reserved_bytes: curve.peak.reserved,
        peak_x: curve.peak_x,
        start_allocated_bytes: start_totals.allocated,
        start_reserved_bytes: start_totals.reserved,
        final_allocated_bytes: curve.last.allocated,
        final_reserved_bytes: curve.last.reserved,
        has_time: curve.has_time,
        time_source: snapshot.tensormem.as_ref().map(|r| match r.time.as_str() {
            "wall" => format!("wall clock on {}", r.device),
            other => format!("{other} on {}", r.device),
        }),
        settings: config.to_string(),
        warnings,
    };
    match bands {
        Bands::None => b.t.allocations.piece_offsets = vec![0; b.t.allocations.size.len() + 1],
        Bands::Full => b.t.lay_full_bands(),
        Bands::ForWidth(width) => {
            let a = &b.t.allocations;
            let laid = stacking::lay_every(&a.size, &a.start, &a.end, trace.len(), (trace.len() as u32 + 1).div_ceil(width));
            b.t.set_bands(laid);
            b.t.bands_for_width = Some(width);
        }
    }
    Ok(b.t)
}

impl Timeline {
    /// Lays the bands out fully, exactly or sampled past [`stacking::PIECE_BUDGET`] pieces (a
    /// warning then says so), where they were laid out for a first image or not at all.
    pub fn lay_full_bands(&mut self) {
        self.lay_full_bands_within(stacking::PIECE_BUDGET);
    }

    fn lay_full_bands_within(&mut self, budget: usize) {
        let a = &self.allocations;
        let laid = stacking::lay(&a.size, &a.start, &a.end, self.events, budget);
        // Laid out again (a second call), the sampling is said once.
        if let Some(warning) = laid.sampled_every.map(notes::sampled_bands).filter(|w| !self.summary.warnings.contains(w)) {
            self.summary.warnings.push(warning);
        }
        self.set_bands(laid);
        self.bands_for_width = None;
    }

    fn set_bands(&mut self, laid: stacking::Bands) {
        self.allocations.piece_offsets = laid.offsets;
        self.pieces = laid.pieces;
    }
}

/// What walking the curves found: each one's peak (the allocated one first reached at
/// `peak_x`), where they end, and whether the trace has times.
struct CurveFacts {
    peak: Totals,
    peak_x: u32,
    last: Totals,
    has_time: bool,
}

#[derive(Default)]
struct Builder {
    t: Timeline,
    /// Stacks by the address of their shared frame list (a loaded pickle shares one per stack),
    /// then by content (JSON and recorded traces may repeat a stack in separate lists).
    stack_ids: FxHashMap<*const Frame, u32>,
    stacks_by_content: FxHashMap<Frames, u32>,
    /// Each stack's group once looked up (`Some(None)`: its frames name none).
    stack_group: Vec<Option<Option<u32>>>,
    frame_ids: FxHashMap<Frame, u32>,
    /// Frame groups by name.
    group_ids: FxHashMap<String, u32>,
    /// Each category's group once one is used, by `Category as usize`.
    category_groups: [Option<u32>; Category::ALL.len()],
    /// The groups of allocations without a stack, by kind.
    special_groups: Vec<(GroupKind, u32)>,
}

impl Builder {
    /// A builder for `trace`, holding the allocations live at `start` (in address order).
    fn new(device: i64, trace: &Trace, start: &StartState, keep_curves: bool) -> Builder {
        let mut b = Builder::default();
        b.t.device = device;
        b.t.events = trace.len();
        let live_at_start = || start.segments.iter().flat_map(|s| s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(move |b| (s, b)));
        // Sized once: a 1 M event trace would otherwise hold its largest arrays twice while growing.
        b.reserve(if keep_curves { trace.len() + 1 } else { 0 }, live_at_start().count() + trace.iter().filter(|e| e.action == Action::Alloc).count());
        for (s, blk) in live_at_start() {
            b.push_alloc(0, blk.address, blk.requested_size, s.stream, Some(&blk.frames), None);
        }
        b
    }

    /// Walks the curves, keeping them if asked: the peaks (counted as `tensormem replay` counts
    /// them as recorded, by the same [`Totals::apply`]) and the first position at the allocated
    /// peak.
    fn lay_curves(&mut self, trace: &Trace, start: Totals, keep: bool) -> CurveFacts {
        let mut facts = CurveFacts { peak: start, peak_x: 0, last: start, has_time: false };
        for (x, at) in curves(trace, start.allocated, start.reserved).enumerate() {
            if keep {
                self.t.allocated.push(at.allocated as f64);
                self.t.reserved.push(at.reserved as f64);
                self.t.time_us.push(at.time_us);
            }
            if at.allocated > facts.peak.allocated {
                (facts.peak.allocated, facts.peak_x) = (at.allocated, x as u32);
            }
            facts.peak.reserved = facts.peak.reserved.max(at.reserved);
            facts.last = Totals { allocated: at.allocated, reserved: at.reserved };
            facts.has_time |= !at.time_us.is_nan();
        }
        facts
    }

    /// The trace's allocations, and its markers: annotations, out-of-memory errors (each also
    /// a warning) and the `user_metadata` each time it changes. Returns whether any entry has
    /// stack frames.
    fn lay_events(&mut self, trace: &Trace, warnings: &mut Vec<String>) -> bool {
        let mut last_metadata: Option<&str> = None;
        let mut any_frames = false;
        for (i, e) in trace.iter().enumerate() {
            let x = i as u32 + 1;
            any_frames |= e.frames.as_ref().is_some_and(|f| !f.is_empty());
            match e.action {
                Action::Alloc => self.push_alloc(x, e.addr, e.size, e.stream, e.frames.as_ref(), e.category),
                Action::Annotate => {
                    let text = e.user_metadata().filter(|m| !m.is_empty()).unwrap_or("annotation").to_string();
                    self.t.markers.push(Marker { x, text });
                }
                Action::Oom => {
                    let (text, warning) = notes::out_of_memory(i, e);
                    warnings.push(warning);
                    self.t.markers.push(Marker { x, text });
                }
                _ => {}
            }
            if let Some(m) = e.user_metadata().filter(|m| e.action != Action::Annotate && !m.is_empty() && Some(*m) != last_metadata) {
                self.t.markers.push(Marker { x, text: m.to_string() });
                last_metadata = Some(m);
            }
        }
        any_frames
    }

    fn reserve(&mut self, positions: usize, allocations: usize) {
        let t = &mut self.t;
        for curve in [&mut t.allocated, &mut t.reserved, &mut t.time_us] {
            curve.reserve_exact(positions);
        }
        let a = &mut t.allocations;
        for v in [&mut a.size, &mut a.addr, &mut a.stream] {
            v.reserve_exact(allocations);
        }
        for v in [&mut a.start, &mut a.stack, &mut a.group] {
            v.reserve_exact(allocations);
        }
    }

    fn push_alloc(&mut self, x: u32, addr: u64, size: u64, stream: i64, frames: Option<&Frames>, category: Option<Category>) {
        let stack = frames.filter(|f| !f.is_empty()).map_or(NO_STACK, |f| self.stack_id(f));
        let named = match (category, frames) {
            (Some(c), _) => Some(self.category_group(c)),
            (None, Some(f)) if stack != NO_STACK => self.stack_group(stack, f),
            (None, _) => None,
        };
        let group = match named {
            Some(g) => g,
            None if x == 0 => self.special_group(GroupKind::BeforeTrace, BEFORE_TRACE),
            None => self.special_group(GroupKind::NoStack, NO_FRAMES),
        };
        let a = &mut self.t.allocations;
        a.size.push(size as f64);
        a.addr.push(addr as f64);
        a.stream.push(stream as f64);
        a.start.push(x);
        a.stack.push(stack);
        a.group.push(group);
    }

    /// Each allocation's end (see [`stacking::lifetimes`]).
    fn lay_lifetimes(&mut self, start: &StartState, trace: &Trace) -> stacking::Lifetimes {
        let mut lifetimes = stacking::lifetimes(start, trace, self.t.allocations.size.len());
        self.t.allocations.end = std::mem::take(&mut lifetimes.end);
        lifetimes
    }

    fn stack_id(&mut self, frames: &Frames) -> u32 {
        let key = frames.as_ptr();
        if let Some(&id) = self.stack_ids.get(&key) {
            return id;
        }
        if let Some(&id) = self.stacks_by_content.get(frames) {
            self.stack_ids.insert(key, id);
            return id;
        }
        let id = self.t.stack_offsets.len() as u32;
        self.t.stack_offsets.push(self.t.stack_frames.len() as u32);
        let first = self.t.stack_frames.len();
        for f in frames.iter() {
            let next = self.frame_ids.len() as u32;
            let fid = *self.frame_ids.entry(f.clone()).or_insert_with(|| {
                self.t.frames.push(f.clone());
                next
            });
            self.t.stack_frames.push(fid);
        }
        self.t.scope_offsets.push(self.t.scope_frames.len() as u32);
        for i in module_scope(frames).into_iter().rev() {
            self.t.scope_frames.push(self.t.stack_frames[first + i]);
        }
        self.stack_group.push(None);
        self.stack_ids.insert(key, id);
        self.stacks_by_content.insert(frames.clone(), id);
        id
    }

    /// The frame group named `name` (frame and category groups are apart: a function called
    /// `input` is not the input category).
    fn group_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.group_ids.get(name) {
            return id;
        }
        let id = self.new_group(name, GroupKind::Frame);
        self.group_ids.insert(name.to_string(), id);
        id
    }

    /// The group of allocations without a stack (apart from frame groups, whatever their names).
    fn special_group(&mut self, kind: GroupKind, name: &str) -> u32 {
        if let Some(&(_, id)) = self.special_groups.iter().find(|(k, _)| *k == kind) {
            return id;
        }
        let id = self.new_group(name, kind);
        self.special_groups.push((kind, id));
        id
    }

    fn category_group(&mut self, category: Category) -> u32 {
        if let Some(id) = self.category_groups[category as usize] {
            return id;
        }
        let id = self.new_group(&category.label(), GroupKind::Category(category));
        self.category_groups[category as usize] = Some(id);
        id
    }

    fn new_group(&mut self, name: &str, kind: GroupKind) -> u32 {
        self.t.groups.push(Group::new(name, kind));
        self.t.groups.len() as u32 - 1
    }

    /// The group a stack's frames name, found the first time an allocation without a category
    /// needs it (so that stacks of categorised allocations add no empty groups).
    fn stack_group(&mut self, stack: u32, frames: &Frames) -> Option<u32> {
        if let Some(known) = self.stack_group[stack as usize] {
            return known;
        }
        let group = group_name(frames).map(|name| self.group_id(&name));
        self.stack_group[stack as usize] = Some(group);
        group
    }

    fn finish_groups(&mut self, peak_x: u32) {
        self.t.stack_offsets.push(self.t.stack_frames.len() as u32);
        self.t.scope_offsets.push(self.t.scope_frames.len() as u32);
        self.t.index_groups(peak_x);
    }
}

/// The snapshot's `record_function` annotations for `device` as position ranges: each START is
/// matched with the next END of the same name (nested scopes nest), a time falls at the first
/// position recorded at or after it, and a scope never closed runs to the end.
fn spans(snapshot: &Snapshot, device: i64, trace: &Trace) -> Vec<Span> {
    let Some(annotations) = &snapshot.external_annotations else { return Vec::new() };
    let time_us: Vec<f64> = curves(trace, 0, 0).map(|p| p.time_us).collect();
    let end = time_us.len() as u32;
    let position = |t: i64| time_us.partition_point(|&x| x.is_nan() || x < t as f64) as u32;
    let mut open: Vec<(String, u32)> = Vec::new();
    let mut out = Vec::new();
    let mut sorted: Vec<_> = annotations.iter().filter(|a| a.device == device && a.time_us.is_some()).collect();
    sorted.sort_by_key(|a| a.time_us);
    for a in sorted {
        let x = position(a.time_us.unwrap_or(0)).min(end);
        if a.stage == "START" {
            open.push((a.name.clone(), x));
        } else if let Some(i) = open.iter().rposition(|(name, _)| *name == a.name) {
            let (name, x0) = open.remove(i);
            out.push(Span { x0, x1: x.max(x0), depth: i as u32, name });
        }
    }
    for (depth, (name, x0)) in open.into_iter().enumerate() {
        out.push(Span { x0, x1: end, depth: depth as u32, name });
    }
    out.sort_by_key(|s| (s.x0, s.depth));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_laid_out_fully_twice_say_once_that_they_are_sampled() {
        // A queue of 400 allocations, each overlapping the next 399: 80,200 exact pieces.
        let n = 400u32;
        let mut t = Timeline { events: 2 * n as usize, ..Default::default() };
        t.allocations.size = vec![1.0; n as usize];
        t.allocations.start = (0..n).collect();
        t.allocations.end = (0..n).map(|i| n + i).collect();
        t.lay_full_bands_within(2_000);
        assert_eq!(t.summary.warnings.len(), 1, "{:?}", t.summary.warnings);
        let pieces = t.pieces.x0.clone();
        t.lay_full_bands_within(2_000);
        assert_eq!(t.summary.warnings.len(), 1, "{:?}", t.summary.warnings);
        assert_eq!(t.pieces.x0, pieces);
    }
}
