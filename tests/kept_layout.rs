//! Laid-out timelines kept for the next open (issue 51): what is read back is what was laid out,
//! a layout kept of other bytes or damaged is never used, and one laid out by other code is
//! never taken for the current one.

mod common;

use std::path::Path;
use tensormem::doctor;
use tensormem::replay::KnownStart;
use tensormem::timeline::kept::{self, InferredCategories, Keep, KeptLayout};
use tensormem::timeline::{self, Allocations, Timeline};
use tensormem::trace::cache::{CacheMiss, SourceKey};
use tensormem::trace::{self, Snapshot};

const KEY: SourceKey = SourceKey { len: 1234, hash: 0x5eed };

/// The page's first layout of a long trace (bands sampled for an image 300 pixels wide).
fn first_layout(snapshot: &Snapshot, device: i64) -> Timeline {
    let start = KnownStart::of(snapshot, device).unwrap();
    timeline::build_for_first_image_from(snapshot, device, &start, 300).unwrap()
}

/// Timelines compared whole: `Debug` shows every field (and NaN equal to NaN).
fn same(a: &Timeline, b: &Timeline) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

fn encoded(t: &Timeline, base: Option<&timeline::Grouping>, inferred: Option<&InferredCategories>) -> Vec<u8> {
    kept::encode_to_vec(t, Keep { base, inferred }, &KEY).unwrap()
}

fn read_back(t: &Timeline, base: Option<&timeline::Grouping>, inferred: Option<&InferredCategories>) -> KeptLayout {
    kept::decode(&encoded(t, base, inferred), &KEY).unwrap()
}

#[test]
fn every_real_snapshot_s_layouts_read_back_equal() {
    let files = common::real_snapshot_files();
    assert!(files.len() > 40, "{} files", files.len());
    for path in files {
        let name = path.display().to_string();
        let snapshot = trace::load_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let Some(device) = snapshot.pick_device() else { continue };
        // As first drawn (sampled bands), then as the page keeps it once laid out fully.
        let mut t = first_layout(&snapshot, device);
        for _ in 0..2 {
            let back = read_back(&t, None, None);
            assert!(same(&back.timeline, &t), "{name}: the kept layout differs from the layout");
            assert!(back.inferred.is_none());
            t.lay_full_bands();
        }
    }
}

#[test]
fn a_view_coloured_otherwise_keeps_the_trace_s_grouping_and_its_inferred_categories() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real/gpt-2.7b-forward.pickle");
    let snapshot = trace::load_file(&path).unwrap();
    let laid = timeline::build(&snapshot, 0).unwrap();
    let codes = doctor::infer_codes(&laid);
    assert!(codes.category.len() == laid.allocations.size.len() && !codes.reasons.is_empty());
    // The page colours the bands by inferred category: the trace's own grouping waits aside.
    let mut shown = laid.clone();
    let base = shown.set_grouping(doctor::grouping(&codes.category));
    assert!(!same(&shown, &laid));
    let back = read_back(&shown, Some(&base), Some(&codes));
    assert!(same(&back.timeline, &laid), "kept in the grouping the trace lays out");
    assert_eq!(back.inferred.as_ref(), Some(&codes));
    // The curves, when laid out with them, read back too.
    assert!(!laid.allocated.is_empty());
}

#[test]
fn a_layout_cut_short_damaged_of_another_file_or_not_a_layout_is_a_miss() {
    let snapshot = common::run_scenario("oom", &[]).snapshot;
    let t = first_layout(&snapshot, 0);
    let bytes = encoded(&t, None, None);
    assert!(kept::decode(&bytes, &KEY).is_ok());
    assert_eq!(kept::decode(&bytes, &SourceKey { len: 1234, hash: 0x5eee }).unwrap_err(), CacheMiss::OtherSource);
    assert_eq!(kept::decode(&bytes[..bytes.len() - 1], &KEY).unwrap_err(), CacheMiss::Damaged);
    for at in [40, bytes.len() / 2, bytes.len() - 30] {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x20;
        assert_eq!(kept::decode(&damaged, &KEY).unwrap_err(), CacheMiss::Damaged, "byte {at} flipped");
    }
    // A kept decode of the same file is not a layout.
    let decode = trace::cache::encode_to_vec(&snapshot, &[], &KEY);
    assert_eq!(kept::decode(&decode, &KEY).unwrap_err(), CacheMiss::Version);
    assert_eq!(kept::decode(&[], &KEY).unwrap_err(), CacheMiss::Version);
}

#[test]
fn a_whole_layout_whose_indices_are_out_of_range_is_refused_without_panicking() {
    let snapshot = common::run_scenario("oom", &[]).snapshot;
    let good = first_layout(&snapshot, 0);
    assert!(good.allocations.size.len() > 2 && !good.groups.is_empty() && good.stack_offsets.len() > 1);
    type Break = (&'static str, fn(&mut Timeline));
    let breaks: [Break; 8] = [
        ("a group past the groups", |t| t.allocations.group[1] = t.groups.len() as u32),
        ("a stack past the stacks", |t| t.allocations.stack[1] = (t.stack_offsets.len() - 1) as u32),
        ("an allocation ending before it starts", |t| t.allocations.end[1] = t.allocations.start[1].wrapping_sub(1)),
        ("an allocation ending past the trace", |t| t.allocations.end[1] = t.events as u32 + 2),
        ("pieces the offsets do not cover", |t| {
            t.pieces.x0.push(0);
            t.pieces.y.push(0.0);
        }),
        ("a frame past the frames", |t| *t.stack_frames.last_mut().unwrap() = t.frames.len() as u32),
        ("a piece past its allocation's end", |t| {
            let last = t.piece_range(1).end - 1;
            t.pieces.x0[last] = t.allocations.end[1] + 1;
        }),
        ("stacks without their scopes", |t| {
            t.scope_offsets.pop();
        }),
    ];
    for (what, make) in breaks {
        let mut t = good.clone();
        make(&mut t);
        let bytes = encoded(&t, None, None);
        assert!(matches!(kept::decode(&bytes, &KEY), Err(CacheMiss::Malformed(_))), "{what}: read back");
    }
    // Sizes that are not whole numbers (a hand-made trace's) are kept as they are.
    let mut fractional = good.clone();
    fractional.allocations.size[0] = 0.5;
    fractional.allocations.addr[1] = f64::NAN;
    let back = read_back(&fractional, None, None).timeline.allocations;
    assert!(back.size[0] == 0.5 && back.addr[1].is_nan() && back.size[1..] == fractional.allocations.size[1..]);
    // A timeline without allocations is whole.
    let empty = Timeline { allocations: Allocations { piece_offsets: vec![0], group_start: vec![0], ..Default::default() }, ..Default::default() };
    assert!(same(&read_back(&empty, None, None).timeline, &empty));
}

/// The hash of a fixture's kept layout, pinned with [`kept::VERSION`]: laying out otherwise makes
/// this fail, so that the version is bumped and the page never shows a layout made by other code
/// as the current one. When it fails on purpose, bump `VERSION` and put the new hash here. A
/// change to the `oom` scenario's recording changes the hash without a new layout: then only the
/// hash is pinned anew (a kept layout is found by its file's content, which changed with it).
#[test]
fn kept_layout_is_pinned() {
    const PINNED: (u32, u64) = (3, 7496149931498265554);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real/gpt-2.7b-forward.pickle");
    let snapshot = trace::load_file(&path).unwrap();
    let mut t = first_layout(&snapshot, 0);
    let sampled = encoded(&t, None, Some(&doctor::infer_codes(&t)));
    t.lay_full_bands();
    let full = encoded(&t, None, None);
    let run = common::run_scenario("oom", &[]).snapshot;
    let scenario = encoded(&first_layout(&run, 0), None, None);
    let hash = xxhash_rust::xxh3::xxh3_64(&[sampled, full, scenario].concat());
    assert_eq!((kept::VERSION, hash), PINNED, "the layout (or the categories inferred) changed: bump timeline::kept::VERSION and pin the new hash");
}
