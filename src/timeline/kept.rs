//! Laid-out timelines kept for the next open (issue 51): the page's second open of a 1 GB file
//! spent 0.8 s laying out its timeline again and 0.2 s inferring its categories, from a trace
//! it had just read back; reading back what was laid out takes a fraction of that.
//!
//! The form is the kept decode's frame (`trace::cache`: header with the source's key, payload,
//! trailer with its length and hash), so a layout kept of other bytes, by another version, cut
//! short or damaged reads as absent. The payload: the timeline's arrays as varints (positions
//! as differences, which are small), the pieces' heights as they are (f32), the small parts as
//! JSON; each allocation's inferred category where the page had inferred them. Groups' counts
//! and the allocations by group are not kept: they are indexed again, as when laid out.
//!
//! A layout depends on the code that laid it out, not only on the trace: [`VERSION`] names the
//! layout, and `kept_layout_is_pinned` (below) fails when a change lays a fixture out otherwise,
//! so that a stale layout can never be shown.

use super::{Allocations, Group, GroupKind, Grouping, Marker, Pieces, Span, Timeline, TimelineSummary};
use crate::trace::cache::{CacheMiss, Malformed, Reader, SourceKey, Writer, read_framed, write_framed};
use crate::trace::{Category, Frame};
use std::io::Write;

const MAGIC: &[u8; 8] = b"TMLAYOUT";
/// Bumped whenever laying out gives other timelines (and the pin below is updated with it).
pub const VERSION: u32 = 3;

/// Each allocation's category as the doctor infers it, a byte per allocation (indices into the
/// doctor's categories, its confidences, and `reasons`): what the page colours by.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InferredCategories {
    pub category: Vec<u8>,
    pub confidence: Vec<u8>,
    pub reason: Vec<u8>,
    pub reasons: Vec<String>,
}

/// What [`decode`] reads back.
#[derive(Debug)]
pub struct KeptLayout {
    pub timeline: Timeline,
    pub inferred: Option<InferredCategories>,
}

/// What [`encode`] keeps beside a timeline.
#[derive(Default)]
pub struct Keep<'k> {
    /// The trace's own grouping, where the timeline is coloured otherwise now (the page keeps
    /// the grouping the trace lays out, whatever it colours by).
    pub base: Option<&'k Grouping>,
    /// The categories inferred for its allocations, if any.
    pub inferred: Option<&'k InferredCategories>,
}

/// Writes `t` (laid out from the source `key` names) to `out`, with what `keep` gives. Its
/// curves, if any, are kept as they are (the page keeps them apart, as numbers it reads back
/// without decoding).
pub fn encode(t: &Timeline, keep: Keep, key: &SourceKey, out: &mut dyn Write) -> std::io::Result<()> {
    let Keep { base, inferred } = keep;
    let (groups, group) = match base {
        Some(b) => (&b.groups, &b.group),
        None => (&t.groups, &t.allocations.group),
    };
    write_framed(MAGIC, VERSION, key, out, |w| {
        w.signed(t.device);
        w.varint(t.events as u64);
        for curve in [&t.allocated, &t.reserved, &t.time_us] {
            w.varint(curve.len() as u64);
            for v in curve.iter() {
                w.raw(&v.to_le_bytes());
            }
            w.flush_if_full()?;
        }
        let a = &t.allocations;
        w.varint(a.size.len() as u64);
        for column in [&a.size, &a.addr, &a.stream] {
            whole_numbers(w, column)?;
        }
        deltas(w, &a.start)?;
        for (id, &end) in a.end.iter().enumerate() {
            w.signed(end as i64 - a.start[id] as i64);
            w.flush_if_full()?;
        }
        for column in [&a.stack, group] {
            for &v in column.iter() {
                w.varint(v.wrapping_add(1) as u64);
                w.flush_if_full()?;
            }
        }
        w.varint(a.piece_offsets.len() as u64);
        deltas(w, &a.piece_offsets)?;
        w.varint(t.pieces.x0.len() as u64);
        deltas(w, &t.pieces.x0)?;
        for y in &t.pieces.y {
            w.raw(&y.to_le_bytes());
            w.flush_if_full()?;
        }
        w.varint(t.frames.len() as u64);
        for f in &t.frames {
            w.str(&f.filename);
            w.varint(f.line);
            w.str(&f.name);
            w.flush_if_full()?;
        }
        for table in [&t.stack_offsets, &t.stack_frames, &t.scope_offsets, &t.scope_frames] {
            w.varint(table.len() as u64);
            deltas(w, table)?;
        }
        w.varint(groups.len() as u64);
        for g in groups {
            w.str(&g.name);
            match g.kind {
                GroupKind::Frame => w.byte(0),
                GroupKind::BeforeTrace => w.byte(1),
                GroupKind::NoStack => w.byte(2),
                GroupKind::Category(c) => {
                    w.byte(3);
                    w.byte(Category::ALL.iter().position(|&k| k == c).expect("a category is in ALL") as u8);
                }
                GroupKind::Unknown => w.byte(4),
            }
            w.byte(g.category as u8);
        }
        w.json(&Some(&t.markers));
        w.json(&Some(&t.spans));
        w.json(&Some(&t.summary));
        w.json(&t.bands_for_width);
        match inferred {
            None => w.byte(0),
            Some(i) => {
                w.byte(1);
                for column in [&i.category, &i.confidence, &i.reason] {
                    w.raw(column);
                    w.flush_if_full()?;
                }
                w.varint(i.reasons.len() as u64);
                for r in &i.reasons {
                    w.str(r);
                }
            }
        }
        Ok(())
    })
}

/// [`encode`] into memory.
pub fn encode_to_vec(t: &Timeline, keep: Keep, key: &SourceKey) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    encode(t, keep, key, &mut bytes)?;
    Ok(bytes)
}

/// Reads back what [`encode`] wrote for the source `key`; anything else is a [`CacheMiss`]. The
/// caller checks that it is of the device and trace it wants ([`Timeline::device`], `events`).
pub fn decode(bytes: &[u8], key: &SourceKey) -> Result<KeptLayout, CacheMiss> {
    read_framed(MAGIC, VERSION, key, bytes, read)
}

/// Numbers kept as f64 that are whole (bytes, addresses, streams): as signed varints, unless one
/// is not (then all as they are).
fn whole_numbers(w: &mut Writer, column: &[f64]) -> std::io::Result<()> {
    let whole = column.iter().all(|&v| (v as i64) as f64 == v);
    w.byte(whole as u8);
    for &v in column {
        if whole {
            w.signed(v as i64)
        } else {
            w.raw(&v.to_le_bytes())
        }
        w.flush_if_full()?;
    }
    Ok(())
}

/// A column of positions or offsets, each as its difference from the one before.
fn deltas(w: &mut Writer, column: &[u32]) -> std::io::Result<()> {
    let mut last = 0i64;
    for &v in column {
        w.signed(v as i64 - last);
        last = v as i64;
        w.flush_if_full()?;
    }
    Ok(())
}

fn read(r: &mut Reader) -> Result<KeptLayout, Malformed> {
    let device = r.signed()?;
    // Positions (events + 1) are u32s.
    let events = usize::try_from(r.varint()?).ok().filter(|&e| e < u32::MAX as usize).ok_or(Malformed)?;
    let mut curves = Vec::with_capacity(3);
    for _ in 0..3 {
        let n = r.count(8)?;
        curves.push(floats(r.raw(n * 8)?));
    }
    let [allocated, reserved, time_us] = <[Vec<f64>; 3]>::try_from(curves).map_err(|_| Malformed)?;
    let n = r.count(7)?;
    let [size, addr, stream] = [read_whole_numbers(r, n)?, read_whole_numbers(r, n)?, read_whole_numbers(r, n)?];
    let start = read_deltas(r, n)?;
    let mut end = Vec::with_capacity(n);
    for &s in &start {
        end.push(position((s as i64).checked_add(r.signed()?).ok_or(Malformed)?)?);
    }
    let mut stack_and_group = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for column in &mut stack_and_group {
        for _ in 0..n {
            column.push((r.varint()? as u32).wrapping_sub(1));
        }
    }
    let [stack, group] = stack_and_group;
    let n_offsets = r.count(1)?;
    let piece_offsets = read_deltas(r, n_offsets)?;
    let n_pieces = r.count(5)?;
    let x0 = read_deltas(r, n_pieces)?;
    let y = r.raw(n_pieces * 4)?.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let n_frames = r.count(3)?;
    let mut frames = Vec::with_capacity(n_frames);
    for _ in 0..n_frames {
        let filename = r.str()?.to_string();
        let line = r.varint()?;
        frames.push(Frame { filename, line, name: r.str()?.to_string() });
    }
    let mut tables = Vec::with_capacity(4);
    for _ in 0..4 {
        let n = r.count(1)?;
        tables.push(read_deltas(r, n)?);
    }
    let [stack_offsets, stack_frames, scope_offsets, scope_frames] = <[Vec<u32>; 4]>::try_from(tables).map_err(|_| Malformed)?;
    let n_groups = r.count(3)?;
    let mut groups = Vec::with_capacity(n_groups);
    for _ in 0..n_groups {
        let name = r.str()?.to_string();
        let kind = match r.byte()? {
            0 => GroupKind::Frame,
            1 => GroupKind::BeforeTrace,
            2 => GroupKind::NoStack,
            3 => GroupKind::Category(*Category::ALL.get(r.byte()? as usize).ok_or(Malformed)?),
            4 => GroupKind::Unknown,
            _ => return Err(Malformed),
        };
        let category = r.byte()? != 0;
        groups.push(Group { name, kind, category, bytes_at_peak: 0, allocations: 0 });
    }
    let markers: Vec<Marker> = r.json()?.ok_or(Malformed)?;
    let spans: Vec<Span> = r.json()?.ok_or(Malformed)?;
    let summary: TimelineSummary = r.json()?.ok_or(Malformed)?;
    let bands_for_width: Option<u32> = r.json()?;
    let inferred = match r.byte()? {
        0 => None,
        1 => {
            let [category, confidence, reason] = [r.raw(n)?.to_vec(), r.raw(n)?.to_vec(), r.raw(n)?.to_vec()];
            let reasons = (0..r.count(1)?).map(|_| r.str().map(str::to_string)).collect::<Result<_, _>>()?;
            Some(InferredCategories { category, confidence, reason, reasons })
        }
        _ => return Err(Malformed),
    };
    let t = Timeline {
        device,
        events,
        allocated,
        reserved,
        time_us,
        allocations: Allocations { size, addr, stream, start, end, stack, group, piece_offsets, by_group: Vec::new(), group_start: Vec::new() },
        pieces: Pieces { x0, y },
        frames,
        stack_offsets,
        stack_frames,
        scope_offsets,
        scope_frames,
        groups,
        markers,
        spans,
        summary,
        bands_for_width,
    };
    check(&t)?;
    let mut timeline = t;
    timeline.index_groups(timeline.summary.peak_x);
    Ok(KeptLayout { timeline, inferred })
}

/// What drawing and indexing a timeline index by must be in range: a damaged layout that passed
/// the checksum (or one written by a bug) is refused, never drawn out of bounds.
fn check(t: &Timeline) -> Result<(), Malformed> {
    let a = &t.allocations;
    let n = a.size.len();
    let pieces = t.pieces.x0.len();
    let offsets_ok = |offsets: &[u32], of: usize| offsets.windows(2).all(|w| w[0] <= w[1]) && offsets.last().is_none_or(|&l| l as usize <= of);
    let ok = a.piece_offsets.len() == n + 1
        && a.piece_offsets.first() == Some(&0)
        && a.piece_offsets.last().is_some_and(|&l| l as usize == pieces)
        && offsets_ok(&a.piece_offsets, pieces)
        && a.end.iter().zip(&a.start).all(|(&e, &s)| s <= e && e as usize <= t.events + 1)
        && a.group.iter().all(|&g| (g as usize) < t.groups.len())
        && a.stack.iter().all(|&s| s == super::NO_STACK || (s as usize) + 1 < t.stack_offsets.len())
        && offsets_ok(&t.stack_offsets, t.stack_frames.len())
        && offsets_ok(&t.scope_offsets, t.scope_frames.len())
        && t.scope_offsets.len() == t.stack_offsets.len()
        && pieces_ok(t)
        && t.stack_frames.iter().chain(&t.scope_frames).all(|&f| (f as usize) < t.frames.len())
        && (t.summary.peak_x as usize) <= t.events
        && [&t.allocated, &t.reserved, &t.time_us].iter().all(|c| c.is_empty() || c.len() == t.events + 1);
    if ok { Ok(()) } else { Err(Malformed) }
}

/// Each allocation's pieces start in order within its lifetime (the raster indexes the axis by
/// them). Called once the offsets are checked.
fn pieces_ok(t: &Timeline) -> bool {
    let a = &t.allocations;
    (0..a.size.len()).all(|id| {
        let x0 = &t.pieces.x0[t.piece_range(id)];
        x0.windows(2).all(|w| w[0] <= w[1]) && x0.iter().all(|&x| a.start[id] <= x && x <= a.end[id])
    })
}

fn floats(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
}

fn position(v: i64) -> Result<u32, Malformed> {
    u32::try_from(v).map_err(|_| Malformed)
}

fn read_whole_numbers(r: &mut Reader, n: usize) -> Result<Vec<f64>, Malformed> {
    if r.byte()? != 0 { (0..n).map(|_| r.signed().map(|v| v as f64)).collect() } else { Ok(floats(r.raw(n.checked_mul(8).ok_or(Malformed)?)?)) }
}

fn read_deltas(r: &mut Reader, n: usize) -> Result<Vec<u32>, Malformed> {
    let mut last = 0i64;
    let mut column = Vec::with_capacity(n);
    for _ in 0..n {
        last = last.checked_add(r.signed()?).ok_or(Malformed)?;
        column.push(position(last)?);
    }
    Ok(column)
}
