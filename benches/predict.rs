//! `cargo bench --bench predict`: `predict` from two ~20k-event recordings (issue 24: well under a
//! second natively). The real pair (the 2.7b LM's first training step at contexts 128 and 256,
//! 19,770 and 20,128 events) when the fixtures are there, and two `lm-train` recordings of the
//! simulator either way; each prediction replays the trace at 4x the larger context.

use std::time::{Duration, Instant};
use tensormem::predict::{self, PredictOptions, Recording, Values};
use tensormem::scenarios::{self, RunRequest};
use tensormem::trace::{self, Snapshot};

/// The median of the seconds `f` takes, over about two seconds of calls (at least three).
fn median_seconds(mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 3 || start.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn bench(name: &str, snapshots: &[Snapshot; 2], at: [u64; 2], target: u64) {
    let values = |v: u64| Values::from([("context".to_string(), v)]);
    let recordings = [
        Recording { label: "a".into(), snapshot: &snapshots[0], values: values(at[0]) },
        Recording { label: "b".into(), snapshot: &snapshots[1], values: values(at[1]) },
    ];
    let events: Vec<usize> = snapshots.iter().map(|s| s.device_traces.iter().map(|t| t.len()).sum()).collect();
    let mut peak = 0;
    let seconds = median_seconds(|| {
        let p = predict::predict(&recordings, &values(target), &PredictOptions::default()).unwrap();
        peak = p.peak_allocated_bytes;
    });
    println!(
        "predict {name} ({} + {} events) at context {target}: {:>7.1} ms (target: well under 1 s); peak allocated {peak} bytes",
        events[0],
        events[1],
        seconds * 1e3
    );
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/pytorch-snapshots");
    let (a, b) = (dir.join("lm2.7b-ctx128-fullstep.pickle"), dir.join("lm2.7b-ctx256-fullstep.pickle"));
    if a.is_file() && b.is_file() {
        let snapshots = [trace::load_file(&a).unwrap(), trace::load_file(&b).unwrap()];
        bench("lm2.7b fullstep, real", &snapshots, [128, 256], 1024);
    } else {
        println!("(the real pair is not in {}: skipped)", dir.display());
    }
    let run = |context: u64| {
        let set = [("size", "small"), ("batch", "4")].iter().map(|(k, v)| (k.to_string(), v.to_string())).chain([("context".to_string(), context.to_string())]);
        scenarios::run(&RunRequest { scenario: "lm-train".into(), set: set.collect(), ..Default::default() }).unwrap().snapshot
    };
    bench("lm-train small, simulated", &[run(64), run(128)], [64, 128], 512);
}
