//! The page's timeline model: bands stack without gaps or overlaps, the top of the stack is the
//! allocated curve, and the curves (counted as `tensormem replay` counts its recorded figures)
//! are what the allocator counted.

mod common;

use std::sync::Arc;
use tensormem::alloc::{AllocatorConfig, RecordContext, VirtualAllocator};
use tensormem::replay::{ReplayOptions, replay_device};
use tensormem::scenarios::{self, RunRequest};
use tensormem::timeline::{self, Timeline};
use tensormem::trace::{self, Frame};

/// At every position, the pieces live there tile [0, allocated) exactly.
fn assert_stacked(name: &str, t: &Timeline) {
    let positions = t.events + 1;
    let mut at: Vec<Vec<(f64, f64)>> = vec![Vec::new(); positions];
    for id in 0..t.allocations.size.len() {
        let size = t.allocations.size[id];
        for p in t.pieces(id as u32) {
            for x in p.x0..p.x1 {
                at[x as usize].push((p.y, size));
            }
        }
    }
    for (x, bands) in at.iter_mut().enumerate() {
        bands.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut top = 0.0;
        for &(y, size) in bands.iter() {
            // Heights are drawing coordinates in f32: exact to its rounding.
            assert!((y - top).abs() <= top * f32::EPSILON as f64, "{name}: position {x}: a band starts at {y}, the one below ends at {top}");
            top += size;
        }
        assert_eq!(top, t.allocated[x], "{name}: position {x}: bands reach {top}, allocated is {}", t.allocated[x]);
    }
}

/// The timeline's peaks and `tensormem replay`'s recorded ones, both counted from the trace
/// alone, are the peaks the allocator itself counted while it recorded the trace (requested
/// bytes for allocated).
#[test]
fn the_peaks_a_trace_shows_are_the_ones_its_allocator_counted() {
    for variant in ["mistake", "fix"] {
        let request = RunRequest { scenario: "variable-batch".into(), variant: Some(variant.into()), ..Default::default() };
        let run = scenarios::run(&request).unwrap();
        let peak_requested = run.steps.iter().map(|s| s.max_requested_bytes).max().unwrap();
        let t = timeline::build(&run.snapshot, 0).unwrap();
        let r = replay_device(&run.snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        for (what, allocated, reserved) in [
            ("timeline", t.summary.peak_allocated_bytes, t.summary.peak_reserved_bytes),
            ("replay", r.recorded.peak_allocated_bytes, r.recorded.peak_reserved_bytes),
        ] {
            assert_eq!((allocated, reserved), (peak_requested, run.peak_reserved_bytes), "{variant}: {what}");
        }
    }
}

#[test]
fn every_fixture_stacks_exactly() {
    let Some(dir) = common::fixtures_dir() else { return };
    for name in common::FIXTURES {
        let snap = trace::load_file(&dir.join(name)).unwrap();
        for device in snap.devices() {
            let t = timeline::build(&snap, device).unwrap();
            assert_eq!(t.allocated.len(), t.events + 1);
            assert_eq!(t.allocated.iter().cloned().fold(0.0, f64::max) as u64, t.summary.peak_allocated_bytes, "{name}");
            assert_eq!(t.reserved.iter().cloned().fold(0.0, f64::max) as u64, t.summary.peak_reserved_bytes, "{name}");
            assert_eq!(t.allocated[t.summary.peak_x as usize] as u64, t.summary.peak_allocated_bytes);
            assert_stacked(name, &t);
            // Allocations come grouped: each group's run holds its own allocations, each once.
            let a = &t.allocations;
            let mut listed = vec![0; a.size.len()];
            for g in 0..t.groups.len() {
                for &id in &a.by_group[a.group_start[g] as usize..a.group_start[g + 1] as usize] {
                    assert_eq!(a.group[id as usize] as usize, g);
                    listed[id as usize] += 1;
                }
            }
            assert!(listed.iter().all(|&n| n == 1), "{name}: an allocation is in no group's run or in two");
            // Each allocation's pieces tile its lifetime, in x order; every allocation is drawn
            // unless it lives nowhere (freed where it was made).
            for id in 0..a.size.len() {
                let pieces: Vec<_> = t.pieces(id as u32).collect();
                let (start, end) = (a.start[id], a.end[id]);
                if start == end {
                    assert!(pieces.is_empty(), "{name}: allocation {id} lives nowhere but has pieces");
                    continue;
                }
                assert!(!pieces.is_empty(), "{name}: allocation {id} has no band");
                assert_eq!((pieces[0].x0, pieces.last().unwrap().x1), (start, end), "{name}: allocation {id}");
                assert!(pieces.iter().all(|p| p.x1 > p.x0), "{name}: allocation {id} has an empty piece");
            }
            // The group sums at the peak are what is live there.
            let at_peak: u64 = t.groups.iter().map(|g| g.bytes_at_peak).sum();
            assert_eq!(at_peak, t.summary.peak_allocated_bytes, "{name}");
        }
    }
}

#[test]
fn training_trace_warns_that_it_starts_mid_run_and_groups_by_user_frame() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let t = timeline::build(&snap, 0).unwrap();
    assert_eq!(t.events, 19136);
    assert_eq!(t.summary.start_reserved_bytes, 7_235_174_400); // no segment event in the trace
    assert!(t.summary.warnings[0].contains("does not start at the beginning"), "{:?}", t.summary.warnings);
    assert!(t.summary.has_time);
    // Bands are coloured by the user's own code (cs336_basics/model.py), not torch internals.
    let mut groups = t.groups.clone();
    groups.sort_by_key(|g| std::cmp::Reverse(g.bytes_at_peak));
    // Parameters were allocated before the trace began and their blocks carry no stack: said so.
    assert_eq!(groups[0].name, timeline::BEFORE_TRACE);
    let top = &groups[1];
    assert_eq!(top.name, "step (cs336_basics/optimizer.py:74)");
    // Backward runs on the autograd engine's C++ thread: grouped by its autograd node.
    assert!(groups.iter().any(|g| g.name == "BmmBackward0 (autograd backward)"), "{:?}", &groups[..10]);
    // Stacks are interned: far fewer distinct frames than frame references.
    assert!(t.frames.len() * 10 < t.stack_frames.len(), "{} frames for {} references", t.frames.len(), t.stack_frames.len());
    // PyTorch's snapshots carry no categories: every group is a frame.
    assert!(t.groups.iter().all(|g| !g.category));
}

/// tensormem's own traces say what their memory is for: those allocations are grouped by
/// category, the rest by the engine op and the program line that called it.
#[test]
fn engine_traces_group_by_category_where_known_and_by_call_site_otherwise() {
    use tensormem::scenarios::{self, RunRequest};
    let run = scenarios::run(&RunRequest { scenario: "variable-batch".into(), ..Default::default() }).unwrap();
    let t = timeline::build(&run.snapshot, 0).unwrap();
    let group = |name: &str| t.groups.iter().find(|g| g.name == name).unwrap_or_else(|| panic!("no group {name}: {:?}", t.groups));
    const MIB: u64 = 1 << 20;
    // 8 layers of fc1 [1024, 4096] and fc2 [4096, 1024] f32 weights: 16 x 16 MiB, all live at the peak.
    let parameters = group("parameter");
    assert!(parameters.category);
    assert_eq!((parameters.allocations, parameters.bytes_at_peak), (16, 256 * MIB));
    // One input per batch; at the peak (batch 40) the current block's input: 40 x 128 x 1024 x 4 bytes.
    let input = group("input");
    assert!(input.category);
    assert_eq!((input.allocations, input.bytes_at_peak), (12, 20 * MIB));
    // Each layer's two matmuls, named by their call site (the same line for every layer, as one
    // line of a Python forward is): 12 batches x 8 layers each.
    let matmuls: Vec<_> = t.groups.iter().filter(|g| g.name.starts_with("matmul (scenarios/variable_batch.rs:")).collect();
    assert_eq!(matmuls.len(), 2, "{:?}", t.groups);
    assert!(matmuls.iter().all(|g| !g.category && g.allocations == 96));
    // At the peak: fc1's output (80 MiB, 4 x wider) and fc2's (20 MiB).
    let mut at_peak: Vec<u64> = matmuls.iter().map(|g| g.bytes_at_peak).collect();
    at_peak.sort();
    assert_eq!(at_peak, vec![20 * MIB, 80 * MIB]);
    // The first matmul's cuBLAS workspace (32 MiB on an H100), once.
    let workspace: Vec<_> = t.groups.iter().filter(|g| g.name.starts_with("at::cuda::getNewWorkspace (scenarios/variable_batch.rs:")).collect();
    assert_eq!(workspace.iter().map(|g| (g.allocations, g.bytes_at_peak)).collect::<Vec<_>>(), [(1, 32 * MIB)]);
    assert_eq!(t.groups.len(), 5, "no empty groups: {:?}", t.groups);
}

#[test]
fn a_freed_band_lowers_the_ones_above_it() {
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1000);
    let f = |name: &str| Arc::from(vec![Frame { filename: "train.py".into(), line: 1, name: name.into() }]);
    let x = a.malloc(1000, 0, Some(f("x"))).unwrap();
    let y = a.malloc(3000, 0, Some(f("y"))).unwrap();
    a.free(x.ptr, None).unwrap();
    let _z = a.malloc(500, 0, Some(f("z"))).unwrap();
    let snap = a.snapshot();
    let t = timeline::build(&snap, 0).unwrap();
    // Events: segment_alloc, alloc x, alloc y, free x (requested, completed), alloc z.
    let allocs: Vec<u32> = t.allocations.start.clone();
    assert_eq!(t.allocations.size, vec![1000.0, 3000.0, 500.0]);
    // y sat on x (y = 1000) until x was freed, then dropped to 0.
    let pieces_of_y: Vec<(u32, u32, f64)> = t.pieces(1).map(|p| (p.x0, p.x1, p.y)).collect();
    let free_x = allocs[1] + 1; // the position after the free_requested that follows y's alloc
    assert_eq!(pieces_of_y, vec![(allocs[1], free_x, 1000.0), (free_x, t.events as u32 + 1, 0.0)]);
    assert_eq!(t.summary.peak_allocated_bytes, 4000);
    assert_eq!(t.groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), vec!["x (train.py:1)", "y (train.py:1)", "z (train.py:1)"]);
    assert!(t.summary.warnings.is_empty(), "{:?}", t.summary.warnings);
    let _ = y;
}

#[test]
fn a_device_the_file_lacks_is_a_clear_error() {
    let snap = trace::Snapshot::default();
    let e = timeline::build(&snap, 3).unwrap_err().to_string();
    assert!(e.contains("device 3") && e.contains("none"), "{e}");
}

#[test]
fn the_allocator_state_at_any_position_holds_exactly_the_live_bands() {
    use tensormem::trace::BlockState;
    let Some(dir) = common::fixtures_dir() else { return };
    for name in common::FIXTURES {
        let snap = trace::load_file(&dir.join(name)).unwrap();
        for device in snap.devices() {
            let t = timeline::build(&snap, device).unwrap();
            let stride = (t.events / 40).max(1);
            for position in (0..=t.events).step_by(stride).chain([t.summary.peak_x as usize, t.events]) {
                let options = ReplayOptions { until: Some(position), ..Default::default() };
                let r = replay_device(&snap, device, &options, &mut |_, _| {}).unwrap();
                // The replay stops exactly there, or just before a step it cannot split (a cache
                // flush, or a segment recorded ahead of the alloc that made it).
                let at = r.events_replayed;
                assert!(at <= position && position - at <= 8, "{name}: {at} vs {position}");
                let requested: u64 =
                    r.segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.requested_size).sum();
                assert_eq!(requested as f64, t.allocated[at], "{name} device {device} position {position}");
                let reserved: u64 = r.segments.iter().map(|s| s.total_size).sum();
                assert_eq!(reserved as f64, t.reserved[at], "{name} device {device} position {position}");
                // Stopped before the end, the final state is not compared: no divergence there.
                if position < t.events {
                    assert!(r.first_divergence.as_ref().is_none_or(|d| d.event < t.events), "{name}: {:?}", r.first_divergence);
                }
            }
        }
    }
}

#[test]
fn the_state_inside_a_burst_of_releases_is_the_one_before_it() {
    let Some(path) = common::fixture("expandable-3gpu-oom.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let t = timeline::build(&snap, 1).unwrap();
    // Device 1 unmaps six pages in a row (events 414..420) before its OOM: positions inside that
    // run stop before it, and say so; every other position is replayed exactly.
    let mut halted = 0;
    for position in 405..=425usize {
        let options = ReplayOptions { until: Some(position), ..Default::default() };
        let r = replay_device(&snap, 1, &options, &mut |_, _| {}).unwrap();
        let at = r.events_replayed;
        assert!(at <= position);
        if at < position {
            halted += 1;
        }
        let reserved: u64 = r.segments.iter().map(|s| s.total_size).sum();
        assert_eq!(reserved as f64, t.reserved[at], "position {position} (replayed to {at})");
    }
    assert!(halted > 0, "the run of unmaps is in this range");
}

#[test]
fn a_trace_that_does_not_add_up_says_so() {
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1000);
    let x = a.malloc(1 << 20, 0, None).unwrap();
    a.free(x.ptr, None).unwrap();
    let _y = a.malloc(1 << 20, 0, None).unwrap();
    let mut snap = a.snapshot();
    // Drop the free pair: the second alloc reuses x's address without a recorded free.
    snap.device_traces[0].retain(|e| !matches!(e.action, trace::Action::FreeRequested | trace::Action::FreeCompleted));
    let t = timeline::build(&snap, 0).unwrap();
    assert!(t.summary.warnings.iter().any(|w| w.contains("does not add up") && w.contains("1 address")), "{:?}", t.summary.warnings);
    // The clean trace has no such warning.
    let t = timeline::build(&a.snapshot(), 0).unwrap();
    assert!(!t.summary.warnings.iter().any(|w| w.contains("does not add up")), "{:?}", t.summary.warnings);
}

/// Rasterises the whole trace with one colour per group (its index + 1), with the page's 6%
/// headroom above the peak, on the event axis.
fn raster_all(t: &Timeline, width: usize, height: usize) -> Vec<u32> {
    let xs: Vec<f64> = (0..t.events + 2).map(|x| x as f64).collect();
    raster_on(t, &xs, width, height)
}

/// The same, with the axis given as every position's coordinate (empty: the event axis).
fn raster_on(t: &Timeline, xs: &[f64], width: usize, height: usize) -> Vec<u32> {
    use tensormem::timeline::raster::{Raster, rasterize};
    // As the page draws them: the groups biggest at the peak first.
    let mut order: Vec<u32> = (0..t.groups.len() as u32).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(t.groups[g as usize].bytes_at_peak));
    let colors: Vec<u32> = (1..=t.groups.len() as u32).collect();
    let ymax = t.summary.peak_allocated_bytes.max(1) as f64 * 1.06;
    rasterize(
        t,
        &Raster { xs, x0: 0.0, x1: (t.events + 1) as f64, width, height, ymax, group_order: &order, group_color: &colors, hidden: &[], ghost: u32::MAX },
    )
}

#[test]
fn the_event_axis_needs_no_coordinates() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let t = timeline::build(&trace::load_file(&path).unwrap(), 0).unwrap();
    let identity = raster_all(&t, 700, 200);
    assert!(identity.iter().any(|&p| p != 0));
    assert_eq!(raster_on(&t, &[], 700, 200), identity);
    // A real axis that is not the identity draws something else.
    let stretched: Vec<f64> = (0..t.events + 2).map(|x| (x as f64).sqrt() * (t.events as f64).sqrt()).collect();
    assert_ne!(raster_on(&t, &stretched, 700, 200), identity);
}

#[test]
fn the_image_is_faithful_to_the_bytes() {
    let Some(dir) = common::fixtures_dir() else { return };
    for name in ["gpt-medium-ctx128-training.pickle", "finetune-legacy.pickle", "gpt-ctx128-forward.pickle"] {
        let snap = trace::load_file(&dir.join(name)).unwrap();
        let t = timeline::build(&snap, 0).unwrap();
        let (width, height) = (1400, 440);
        let pixels = raster_all(&t, width, height);
        // Each group's share of the painted pixels follows its share of bytes x time: slivers
        // never take over what bigger bands hold (interleaved bands keep their own colours).
        let mut area = vec![0.0f64; t.groups.len()];
        for id in 0..t.allocations.size.len() {
            for p in t.pieces(id as u32) {
                area[t.allocations.group[id] as usize] += t.allocations.size[id] * (p.x1 - p.x0) as f64;
            }
        }
        let total_area: f64 = area.iter().sum();
        let mut painted = vec![0usize; t.groups.len() + 1];
        for &p in &pixels {
            painted[p as usize] += 1;
        }
        let total_painted: usize = painted[1..].iter().sum();
        for (g, group) in t.groups.iter().enumerate() {
            let expected = area[g] / total_area;
            let got = painted[g + 1] as f64 / total_painted as f64;
            if expected > 0.02 {
                assert!(
                    got > expected * 0.7 && got < expected * 1.3,
                    "{name}: {:?} holds {:.1}% of bytes x time but {:.1}% of pixels",
                    group.name,
                    expected * 100.0,
                    got * 100.0
                );
            }
            assert!(got < expected * 3.0 + 0.005, "{name}: {:?} holds {:.2}% of bytes x time but {:.2}% of pixels", group.name, expected * 100.0, got * 100.0);
        }
        // Nothing live is ever left blank: in every column, the highest painted pixel lies
        // between the stack's height at the column's centre and its highest over every position
        // the column touches (to a pixel).
        let positions_per_column = (t.events + 1) as f64 / width as f64;
        let sy = height as f64 / (t.summary.peak_allocated_bytes as f64 * 1.06);
        let row_of = |bytes: f64| (height as f64 - bytes * sy).floor().max(0.0) as usize;
        for c in 0..width {
            let first = (c as f64 * positions_per_column).floor() as usize;
            let last = (((c + 1) as f64 * positions_per_column).ceil() as usize).min(t.events + 1);
            let highest = t.allocated[first..last].iter().cloned().fold(0.0, f64::max);
            let centre = t.allocated[(((c as f64 + 0.5) * positions_per_column) as usize).min(t.events)];
            if highest * sy < 0.5 {
                continue;
            }
            let row = (0..height).find(|&row| pixels[row * width + c] != 0);
            let row = row.unwrap_or_else(|| panic!("{name}: column {c} is blank, {highest} bytes live"));
            assert!(
                row + 1 >= row_of(highest) && row <= row_of(centre) + 1,
                "{name}: column {c}: painted from row {row}, stack from {} to {}",
                row_of(highest),
                row_of(centre)
            );
        }
    }
}

#[test]
fn a_byte_next_to_a_gigabyte_is_never_lost_in_empty_space() {
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 100_000);
    let f = |name: &str| Arc::from(vec![Frame { filename: "train.py".into(), line: 1, name: name.into() }]);
    let _big = a.malloc(1 << 30, 0, Some(f("big"))).unwrap();
    for _ in 0..2000 {
        let tiny = a.malloc(1, 0, Some(f("tiny"))).unwrap();
        a.free(tiny.ptr, None).unwrap();
    }
    let t = timeline::build(&a.snapshot(), 0).unwrap();
    let pixels = raster_all(&t, 100, 50);
    let tiny = t.groups.iter().position(|g| g.name.starts_with("tiny")).unwrap() as u32 + 1;
    let big = t.groups.iter().position(|g| g.name.starts_with("big")).unwrap() as u32 + 1;
    // 2000 one-byte allocations, each living two events out of ~8000, on top of 1 GiB: smaller
    // than a pixel every way. They never take the gigabyte's pixels, but the row above it, which
    // nothing else holds, is theirs.
    let tiny_pixels = pixels.iter().filter(|&&p| p == tiny).count();
    assert!(tiny_pixels >= 90, "{tiny_pixels}");
    assert_eq!(pixels.iter().filter(|&&p| p == big).count(), 100 * 47);
}

#[test]
fn the_pointer_finds_the_band_under_it() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let t = timeline::build(&snap, 0).unwrap();
    let a = &t.allocations;
    let mut hidden = vec![0u8; a.size.len()];
    for id in (0..a.size.len()).step_by(7) {
        // The middle of each of its rectangles, at the first and last position it covers.
        let pieces = t.pieces_of(id as u32);
        assert_eq!(pieces.len(), 3 * t.piece_range(id).len());
        for p in pieces.chunks_exact(3) {
            let (x0, x1, y) = (p[0] as u32, p[1] as u32, p[2]);
            // Heights are f32 drawing coordinates: a band thinner than a few of their rounding
            // steps (a millionth of its height, far below a pixel) is not pointable exactly.
            if a.size[id] < y / (1 << 20) as f64 {
                continue;
            }
            for pos in [x0, x1 - 1] {
                assert_eq!(t.hit_test(pos, y + a.size[id] / 2.0, 0.0, &[]), Some(id as u32), "allocation {id} at {pos}");
                // The exact band wins over a neighbour within the slack.
                assert_eq!(t.hit_test(pos, y, 1e9, &[]), Some(id as u32), "allocation {id} at {pos}, its bottom edge");
            }
        }
        // Hidden, it is not found; and nothing is found above the allocated curve.
        hidden[id] = 1;
        let p = t.pieces_of(id as u32);
        assert_ne!(t.hit_test(p[0] as u32, p[2] + a.size[id] / 2.0, 0.0, &hidden), Some(id as u32));
        hidden[id] = 0;
        let pos = a.start[id];
        assert_eq!(t.hit_test(pos, t.allocated[pos as usize] + 1.0, 0.0, &[]), None);
    }
}

/// The keyboard's view of a position: every live band, bottom up, each sitting on the one below;
/// the same answer the pointer gets at each band's middle.
#[test]
fn the_stack_at_a_position_lists_the_live_bands_bottom_up() {
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1000);
    let f = |name: &str| Arc::from(vec![Frame { filename: "train.py".into(), line: 1, name: name.into() }]);
    let x = a.malloc(1000, 0, Some(f("x"))).unwrap();
    let _y = a.malloc(3000, 0, Some(f("y"))).unwrap();
    let _z = a.malloc(500, 0, Some(f("z"))).unwrap();
    a.free(x.ptr, None).unwrap();
    let snap = a.snapshot();
    let t = timeline::build(&snap, 0).unwrap();
    let end = t.events as u32;
    let before_free = t.allocations.start[2];
    assert_eq!(t.stack_at(before_free, &[]), vec![(0, 0.0), (1, 1000.0), (2, 4000.0)]);
    // x freed: y and z drop by its size.
    assert_eq!(t.stack_at(end, &[]), vec![(1, 0.0), (2, 3000.0)]);
    // Hidden bands are skipped; a position before any allocation has none.
    assert_eq!(t.stack_at(before_free, &[0, 1, 0]), vec![(0, 0.0), (2, 4000.0)]);
    assert_eq!(t.stack_at(0, &[]), vec![]);
    for pos in 0..=end {
        for (id, y) in t.stack_at(pos, &[]) {
            assert_eq!(t.hit_test(pos, y + t.allocations.size[id as usize] / 2.0, 0.0, &[]), Some(id), "{id} at {pos}");
        }
    }
}

/// Code tells groups apart by `kind`, never by their names (which are for people): a frame
/// that happens to be named like the grey groups stays a frame, and categories carry their
/// snapshot key.
#[test]
fn groups_carry_a_stable_kind_apart_from_their_names() {
    use tensormem::timeline::GroupKind;
    use tensormem::trace::Category;
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1000);
    let odd = Arc::from(vec![Frame { filename: String::new(), line: 0, name: timeline::NO_FRAMES.into() }]);
    let _framed = a.malloc(1000, 0, Some(odd)).unwrap();
    let _bare = a.malloc(2000, 0, None).unwrap();
    let t = timeline::build(&a.snapshot(), 0).unwrap();
    let kinds: Vec<_> = t.groups.iter().map(|g| g.kind).collect();
    assert_eq!(kinds.iter().filter(|&&k| k == GroupKind::NoStack).count(), 1, "{:?}", t.groups);
    let bare = t.allocations.group[1] as usize;
    assert_eq!((t.groups[bare].kind, t.groups[bare].name.as_str()), (GroupKind::NoStack, timeline::NO_FRAMES));
    assert_ne!(t.allocations.group[0], t.allocations.group[1], "{:?}", t.groups);

    use tensormem::scenarios::{self, RunRequest};
    let run = scenarios::run(&RunRequest { scenario: "variable-batch".into(), ..Default::default() }).unwrap();
    let t = timeline::build(&run.snapshot, 0).unwrap();
    let parameters = t.groups.iter().find(|g| g.kind == GroupKind::Category(Category::Parameter)).unwrap();
    assert!(parameters.category);
    let json = serde_json::to_value(&t.groups).unwrap();
    let kinds: Vec<&str> = json.as_array().unwrap().iter().map(|g| g["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"parameter") && kinds.contains(&"input") && kinds.contains(&"frame"), "{kinds:?}");
    assert_eq!(GroupKind::Category(Category::OptimizerState).key(), "optimizer_state");

    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let t = timeline::build(&trace::load_file(&path).unwrap(), 0).unwrap();
    let before = t.groups.iter().find(|g| g.name == timeline::BEFORE_TRACE).unwrap();
    assert_eq!(before.kind, GroupKind::BeforeTrace);
    assert!(t.groups.iter().filter(|g| g.name != timeline::BEFORE_TRACE).all(|g| g.kind == GroupKind::Frame));
}

#[test]
fn module_scope_is_the_chain_of_module_calls_then_the_allocating_line() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let snap = trace::load_file(&path).unwrap();
    let t = timeline::build(&snap, 0).unwrap();
    let scope_of = |s: usize| -> Vec<String> {
        let frames = &t.scope_frames[t.scope_offsets[s] as usize..t.scope_offsets[s + 1] as usize];
        frames
            .iter()
            .rev()
            .map(|&f| format!("{}:{} {}", t.frames[f as usize].filename.rsplit('/').next().unwrap(), t.frames[f as usize].line, t.frames[f as usize].name))
            .collect()
    };
    let scopes: Vec<Vec<String>> = (0..t.stack_offsets.len() - 1).map(scope_of).collect();
    // The script calls the model at nsys_profile.py:142; the model's forward calls a block at
    // model.py:253, whose forward calls a layer at model.py:382, which allocates at model.py:101.
    let expected = ["nsys_profile.py:142 memory_profile", "model.py:253 forward", "model.py:382 forward", "model.py:101 forward"];
    assert!(scopes.iter().any(|s| s == &expected), "no stack has the scope {expected:?}: {:?}", &scopes[..20]);
    // Backward on the autograd thread and the optimizer step are inside no module.
    let empty = scopes.iter().filter(|s| s.is_empty()).count();
    assert!(empty > 0 && empty < scopes.len(), "{empty} of {} stacks have no module scope", scopes.len());
    // Every scope's module-call lines are Python frames outside torch/nn/modules/module.py.
    for s in &scopes {
        assert!(s.iter().all(|f| f.contains(".py:") && !f.starts_with("module.py:")), "{s:?}");
    }
}

#[test]
fn a_stack_is_one_entry_of_the_stack_table_however_the_file_shares_it() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let from_pickle = trace::load_file(&path).unwrap();
    // JSON repeats every stack as separate frame objects; the pickle shares them.
    let from_json = trace::load(trace::to_json(&from_pickle).as_bytes()).unwrap();
    let (p, j) = (timeline::build(&from_pickle, 0).unwrap(), timeline::build(&from_json, 0).unwrap());
    assert_eq!(j.stack_offsets.len(), p.stack_offsets.len());
    assert_eq!(j.stack_frames, p.stack_frames);
    assert_eq!(j.allocations.group, p.allocations.group);
    // And the loaded JSON keeps one copy of each stack.
    let lists =
        |s: &trace::Snapshot| s.device_traces[0].iter().filter_map(|e| e.frames.as_ref()).map(|f| f.as_ptr()).collect::<std::collections::HashSet<_>>().len();
    assert_eq!(lists(&from_json), lists(&from_pickle));
}

#[test]
fn groups_the_trace_lacks_are_skipped_when_drawing() {
    use tensormem::timeline::raster::{Raster, rasterize};
    let Some(path) = common::fixture("small-state.pickle") else { return };
    let t = timeline::build(&trace::load_file(&path).unwrap(), 0).unwrap();
    let n = t.groups.len() as u32;
    let xs: Vec<f64> = (0..t.events + 2).map(|x| x as f64).collect();
    let draw = |order: &[u32], colors: &[u32]| {
        rasterize(
            &t,
            &Raster {
                xs: &xs,
                x0: 0.0,
                x1: (t.events + 1) as f64,
                width: 300,
                height: 100,
                ymax: t.summary.peak_allocated_bytes.max(1) as f64,
                group_order: order,
                group_color: colors,
                hidden: &[],
                ghost: 0,
            },
        )
    };
    let order: Vec<u32> = (0..n).collect();
    let colors: Vec<u32> = (1..=n).collect();
    // A page that still holds the previous trace's longer palette names groups past the end.
    let longer_order: Vec<u32> = (0..n + 5).collect();
    let longer_colors: Vec<u32> = (1..=n + 5).collect();
    assert_eq!(draw(&longer_order, &longer_colors), draw(&order, &colors));
}

#[test]
fn an_engine_stacks_module_scope_is_its_module_path_then_the_op() {
    use tensormem::nn::Linear;
    let dev = tensormem::Device::sim(tensormem::SimOptions::preset("H100-80GB"));
    let linear = Linear::new(&dev, "layers.0.fc", 8, 4, true, tensormem::DType::F32).unwrap();
    let x = dev.zeros(&[2, 8], tensormem::DType::F32).unwrap();
    let _y = linear.forward(&x).unwrap();
    let t = timeline::build(&dev.snapshot(), 0).unwrap();
    let scopes: Vec<Vec<String>> = (0..t.stack_offsets.len() - 1)
        .map(|s| {
            t.scope_frames[t.scope_offsets[s] as usize..t.scope_offsets[s + 1] as usize].iter().rev().map(|&f| t.frames[f as usize].name.clone()).collect()
        })
        .collect();
    // The parameters are made inside no module's forward; the product inside layers.0.fc.
    assert!(scopes.iter().any(|s| s.is_empty()), "{scopes:?}");
    assert!(scopes.iter().any(|s| s == &["layers.0.fc".to_string(), "addmm".to_string()]), "{scopes:?}");
}

/// The page recolours a timeline (`Timeline::set_grouping`): the groups' counts and the
/// allocations by group follow the new grouping, and putting the old one back restores the
/// timeline exactly. `frame_grouping` groups a trace that records categories by frame, as the
/// builder groups the same trace without them.
#[test]
fn a_timeline_can_be_regrouped_and_grouped_by_frame_whatever_it_records() {
    let run = scenarios::run(&RunRequest { scenario: "variable-batch".into(), ..Default::default() }).unwrap();
    let mut t = timeline::build(&run.snapshot, 0).unwrap();
    assert!(t.groups.iter().any(|g| g.category));
    let (groups, by_group, group_start) = (t.groups.clone(), t.allocations.by_group.clone(), t.allocations.group_start.clone());
    let frames = t.frame_grouping();
    // As the builder groups the trace without its categories.
    let mut stripped = run.snapshot.clone();
    for t in &mut stripped.device_traces {
        t.edit(|e| e.category = None);
    }
    let plain = timeline::build(&stripped, 0).unwrap();
    let names = |groups: &[timeline::Group], group: &[u32]| -> Vec<(String, timeline::GroupKind)> {
        group.iter().map(|&g| (groups[g as usize].name.clone(), groups[g as usize].kind)).collect()
    };
    assert_eq!(names(&frames.groups, &frames.group), names(&plain.groups, &plain.allocations.group));
    let recorded = t.set_grouping(frames);
    // Counts, bytes at the peak and the allocations by group: those of the plain timeline.
    let summary = |groups: &[timeline::Group]| -> Vec<(String, u32, u64)> {
        let mut v: Vec<_> = groups.iter().map(|g| (g.name.clone(), g.allocations, g.bytes_at_peak)).collect();
        v.sort();
        v
    };
    assert_eq!(summary(&t.groups), summary(&plain.groups));
    for g in 0..t.groups.len() {
        let members = &t.allocations.by_group[t.allocations.group_start[g] as usize..t.allocations.group_start[g + 1] as usize];
        assert!(members.windows(2).all(|w| w[0] < w[1]), "in id order");
        assert!(members.iter().all(|&id| t.allocations.group[id as usize] == g as u32));
    }
    assert_eq!(*t.allocations.group_start.last().unwrap() as usize, t.allocations.size.len());
    // Back to the recorded categories: exactly as built.
    t.set_grouping(recorded);
    assert_eq!(serde_json::to_value(&t.groups).unwrap(), serde_json::to_value(&groups).unwrap());
    assert_eq!((t.allocations.by_group.clone(), t.allocations.group_start.clone()), (by_group, group_start));
}

/// The hostile shapes of issue 30: allocations freed oldest first (a queue, a sliding window)
/// would take one piece per band above each free, the square of the allocations (800 M pieces
/// for 40,000). The layout stays within its budget, says that the bands are sampled, and keeps
/// the curves and lifetimes exact; freed newest first, every band stays exact.
#[test]
fn bands_freed_oldest_first_are_laid_out_within_a_budget() {
    let budget = (1usize << 24) + 2 * 40_000;
    // (name, trace, most live at once: the window holds one more just before it frees the oldest)
    for (name, snap, live) in [("queue", common::shapes::queue(40_000, true), 40_000u64), ("window", common::shapes::window(100_000, 2_000), 2_001)] {
        let t = timeline::build(&snap, 0).unwrap();
        assert!(t.pieces.x0.len() <= budget, "{name}: {} pieces", t.pieces.x0.len());
        assert!(t.summary.warnings.iter().any(|w| w.contains("drawn at their true heights every")), "{name}: {:?}", t.summary.warnings);
        assert_eq!(t.summary.peak_allocated_bytes, live * 512, "{name}");
        let ends_in_order = (1..t.allocations.end.len()).all(|id| t.allocations.end[id] >= t.allocations.end[id - 1]);
        assert!(ends_in_order, "{name}: freed oldest first");
    }
    let t = timeline::build(&common::shapes::queue(2_000, false), 0).unwrap();
    assert_eq!(t.pieces.x0.len(), 2_000, "freed newest first, each band is one rectangle");
    assert!(!t.summary.warnings.iter().any(|w| w.contains("true heights")), "{:?}", t.summary.warnings);
    assert_stacked("lifo", &t);
}

/// A trace whose file lacks its final segments: every free is unaccounted for. The page names a
/// few and counts the rest in one line, rather than a warning per event.
#[test]
fn a_trace_without_its_segments_warns_in_a_few_lines() {
    let t = timeline::build(&common::shapes::queue(1_000, true), 0).unwrap();
    let about_events: Vec<&String> = t.summary.warnings.iter().filter(|w| w.starts_with("event ") || w.contains("more events like these")).collect();
    assert_eq!(about_events.len(), 6, "{about_events:?}");
    // 3,001 events (the segment, 1,000 allocs, 1,000 pairs of frees) cannot be undone; 5 named.
    assert!(about_events[5].starts_with("2996 more events like these"), "{}", about_events[5]);
}

/// A long trace's first image is drawn from bands laid out a sample per pixel column: at each
/// sample they lie exactly where the full layout puts them, nothing else of the timeline differs,
/// and laying them out fully afterwards gives the full layout itself.
#[test]
fn bands_laid_out_for_a_first_image_are_the_full_ones_at_each_column() {
    let lm = scenarios::run(&RunRequest { scenario: "lm-train".into(), ..Default::default() }).unwrap().snapshot;
    let dir = common::fixtures_dir();
    let fixtures = dir.iter().flat_map(|dir| common::FIXTURES.iter().map(move |name| (name.to_string(), trace::load_file(&dir.join(name)).unwrap())));
    for (name, snap) in [("lm-train".to_string(), lm)].into_iter().chain(fixtures) {
        for device in snap.devices() {
            let known = tensormem::replay::KnownStart::of(&snap, device).unwrap();
            let full = timeline::build_without_curves_from(&snap, device, &known).unwrap();
            let width = 37;
            let mut first = timeline::build_for_first_image_from(&snap, device, &known, width).unwrap();
            assert_eq!(first.bands_for_width, Some(width));
            assert_eq!(full.bands_for_width, None);
            let (a, b) = (&first.allocations, &full.allocations);
            assert_eq!((&a.start, &a.end, &a.group, &a.stack), (&b.start, &b.end, &b.group, &b.stack), "{name}");
            assert_eq!(serde_json::to_string(&first.summary).unwrap(), serde_json::to_string(&full.summary).unwrap(), "{name}");
            assert_eq!(first.groups.len(), full.groups.len(), "{name}");
            let step = (first.events as u32 + 1).div_ceil(width).max(2);
            let height_at = |t: &Timeline, id: usize, x: u32| t.pieces(id as u32).find(|p| p.x0 <= x && x < p.x1).map(|p| p.y);
            for id in 0..a.size.len() {
                let pieces: Vec<_> = first.pieces(id as u32).collect();
                if a.start[id] == a.end[id] {
                    assert!(pieces.is_empty(), "{name}: allocation {id} lives nowhere but has pieces");
                    continue;
                }
                assert_eq!((pieces[0].x0, pieces.last().unwrap().x1), (a.start[id], a.end[id]), "{name}: allocation {id}");
                for x in (a.start[id]..a.end[id]).filter(|x| x % step == 0) {
                    assert_eq!(height_at(&first, id, x), height_at(&full, id, x), "{name}: allocation {id} at sample {x}");
                }
            }
            first.lay_full_bands();
            assert_eq!(first.bands_for_width, None);
            assert_eq!(
                (&first.allocations.piece_offsets, &first.pieces.x0, &first.pieces.y),
                (&full.allocations.piece_offsets, &full.pieces.x0, &full.pieces.y),
                "{name}"
            );
            assert_eq!(first.summary.warnings, full.summary.warnings, "{name}");
        }
    }
}
