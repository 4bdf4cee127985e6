//! `cargo bench --bench doctor`: the doctor on a 1 M-entry training-loop snapshot (the synthetic
//! one the page's browser benchmark uses), against a baseline measured in the same run: one
//! replay of the same trace through the allocator. Target (issue 23): the doctor takes at most a
//! few times the replay's own time (it replays the trace for its what-ifs, and lays it out).

use std::time::Instant;
use tensormem::doctor::{self, DoctorOptions};
use tensormem::replay::{ReplayOptions, replay_device};

#[allow(dead_code)]
#[path = "../examples/synth_snapshot.rs"]
mod synth;

#[path = "../tests/common/shapes.rs"]
mod shapes;

/// The best of `runs` timings of `f`, in seconds.
fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Issue 30: the doctor on allocations freed oldest first (a queue of 200,000 live, a sliding
/// window of 2,000 over 200,000) against the same allocations freed newest first, in the same
/// run. Target: at most 3x. Then the page's layout of the same shapes (bands within a budget).
fn free_orders() {
    let diagnose = |snapshot: &tensormem::trace::Snapshot| best(3, || doctor::diagnose(snapshot, &DoctorOptions::default()).unwrap());
    let layout = |snapshot: &tensormem::trace::Snapshot| best(3, || tensormem::timeline::build(snapshot, 0).unwrap());
    let newest_first = shapes::queue(200_000, false);
    let baseline = diagnose(&newest_first);
    for (name, snapshot) in [("oldest first (a queue)", shapes::queue(200_000, true)), ("a sliding window of 2,000", shapes::window(200_000, 2_000))] {
        let t = diagnose(&snapshot);
        println!(
            "doctor on 200,000 allocations freed {name}: {:>8.1} ms = {:.2}x the same freed newest first ({:.1} ms; target: at most 3x); \
             the page's layout {:.1} ms (newest first {:.1} ms)",
            t * 1e3,
            t / baseline,
            baseline * 1e3,
            layout(&snapshot) * 1e3,
            layout(&newest_first) * 1e3,
        );
    }
}

fn main() {
    free_orders();
    for entries in [100_000, 1_000_000] {
        let (snapshot, steps) = synth::synthesize(entries);
        let events = snapshot.trace_of(0).len();
        let replay = best(3, || replay_device(&snapshot, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap());
        let layout = best(3, || tensormem::timeline::build(&snapshot, 0).unwrap());
        let mut findings = Vec::new();
        let diagnose = best(3, || {
            let d = doctor::diagnose(&snapshot, &DoctorOptions::default()).unwrap();
            findings = d.findings.iter().map(|f| f.kind.clone()).collect();
        });
        println!(
            "doctor on {events} entries ({steps} steps): {:>8.1} ms = {:.2}x one replay ({:.1} ms; target: a few times); \
             of which the timeline layout {:.1} ms ({:.2}x); findings: {}",
            diagnose * 1e3,
            diagnose / replay,
            replay * 1e3,
            layout * 1e3,
            layout / replay,
            findings.join(", ")
        );
    }
}
