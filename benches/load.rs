//! `cargo bench --bench load`: opening a snapshot, phase by phase, against a baseline measured in
//! the same run: a plain read of the file's bytes (issue 51). Phases: decoding the file into a
//! `Snapshot`, opening it again from the kept decode (hashing the file, reading the cache file
//! back), the page's timeline layout and its first image (and the same image from bands laid
//! out for it alone, as the page draws a long trace first; that layout kept and read back, as
//! the page's second open draws it), and one replay (what `tensormem
//! summary` adds), the second time from the start state kept beside the decode. On
//! generated training-loop snapshots of 100 k and 1 M entries (about 10 and 100 MB), and on
//! `TENSORMEM_BIG` when it names a file (`python3 ../shared/tools/gen_big_snapshot.py 11500000
//! big.pickle` writes the 1.04 GB one). Goal for the 1 GB file: `summary` within 4 s.

use std::path::Path;
use std::time::Instant;
use tensormem::replay::{KnownStart, ReplayOptions, replay_device};
use tensormem::timeline::kept;
use tensormem::trace;

#[allow(dead_code)]
#[path = "../examples/synth_snapshot.rs"]
mod synth;

/// Seconds `f` takes, with its result.
fn timed<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let start = Instant::now();
    let out = f();
    (start.elapsed().as_secs_f64(), out)
}

fn phases(name: &str, path: &Path) {
    let (read, bytes) = timed(|| std::fs::read(path).unwrap());
    let size = bytes.len();
    drop(bytes);
    let (load, snapshot) = timed(|| trace::load_file(path).unwrap());
    let events = snapshot.trace_of(0).len();
    // The second open: the decode kept (issue 51's cache), written and read back.
    let (hash, key) = timed(|| trace::key_of_file(path, &mut |_| {}).unwrap());
    let (start, known) = timed(|| KnownStart::of(&snapshot, 0).unwrap());
    let (keep, kept) = timed(|| trace::cache::encode_to_vec(&snapshot, &[known.to_kept()], &key));
    let (reopen, again) = timed(|| trace::cache::decode_with_starts(&kept, &key).unwrap());
    assert!(again.snapshot == snapshot);
    let (layout, timeline) = timed(|| tensormem::timeline::build(&snapshot, 0).unwrap());
    let (image, _) = timed(|| first_image(&timeline));
    drop(timeline);
    // The page's first image of a long trace: its bands laid out for it alone (a sample per
    // pixel column), from the start state the page reconstructed first.
    let (alone, first) = timed(|| {
        let t = tensormem::timeline::build_for_first_image_from(&snapshot, 0, &known, 1400).unwrap();
        first_image(&t);
        t
    });
    // The page's second open draws from that layout kept (`timeline::kept`; its curves are
    // kept as numbers, read back without decoding).
    let (keep_layout, layout_kept) = timed(|| kept::encode_to_vec(&first, kept::Keep::default(), &key).unwrap());
    let (layout_again, _) = timed(|| kept::decode(&layout_kept, &key).unwrap());
    drop(first);
    let (replay, _) = timed(|| replay_device(&snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap());
    let known_again = KnownStart::all_kept(&again.snapshot, again.starts).pop();
    let (replay_again, _) =
        timed(|| replay_device(&again.snapshot, 0, &ReplayOptions { known_start: known_again, ..Default::default() }, &mut |_, _| {}).unwrap());
    drop(again.snapshot);
    println!(
        "{name}: {:.1} MB, {events} entries; read {:.2} s; decode {:.2} s = {:.1}x the read; again from the cache: hash {:.2} s ({:.1}x) + read back {:.2} s ({:.1}x) of {:.1} MB kept in {:.2} s; layout {:.2} s ({:.1}x); its first image {:.2} s; or, with bands laid out for it alone, both {:.2} s after the start, kept ({:.1} MB, in {:.2} s) and read back in {:.2} s ({:.1}x); replay {:.2} s ({:.1}x), of which its start {:.2} s; from the start kept {:.2} s ({:.1}x)",
        size as f64 / 1e6,
        read,
        load,
        load / read,
        hash,
        hash / read,
        reopen,
        reopen / read,
        kept.len() as f64 / 1e6,
        keep,
        layout,
        layout / read,
        image,
        alone,
        layout_kept.len() as f64 / 1e6,
        keep_layout,
        layout_again,
        layout_again / read,
        replay,
        replay / read,
        start,
        replay_again,
        replay_again / read
    );
}

/// The page's first image of a timeline: the whole trace, 1400 x 400 pixels, groups in order.
fn first_image(t: &tensormem::timeline::Timeline) -> Vec<u32> {
    let order: Vec<u32> = (0..t.groups.len() as u32).collect();
    let colors: Vec<u32> = order.iter().map(|g| 0xff00_0000 | (g.wrapping_mul(0x9e37_79b9) >> 8)).collect();
    let ymax = t.summary.peak_reserved_bytes.max(1) as f64;
    let r = tensormem::timeline::raster::Raster {
        xs: &[],
        x0: 0.0,
        x1: (t.events + 1) as f64,
        width: 1400,
        height: 400,
        ymax,
        group_order: &order,
        group_color: &colors,
        hidden: &[],
        ghost: 0,
    };
    tensormem::timeline::raster::rasterize(t, &r)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("tensormem-bench-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entries in [100_000, 1_000_000] {
        let path = dir.join(format!("synth-{entries}.pickle"));
        trace::save_file(&synth::synthesize(entries).0, &path).unwrap();
        phases(&format!("generated, {entries} entries"), &path);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(big) = std::env::var_os("TENSORMEM_BIG") {
        phases("TENSORMEM_BIG", Path::new(&big));
    }
}
