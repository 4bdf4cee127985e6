//! Any bytes: loading must return Ok or a clear error; whatever loads must replay, write its
//! replayed trace (as `replay --snapshot` does) and re-serialize without a panic, and every
//! snapshot written must load again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensormem::replay::{replay_snapshot, ReplayOptions};
use tensormem::trace;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = trace::load(data) {
        let options = ReplayOptions { keep_snapshot: true, ..Default::default() };
        for replayed in replay_snapshot(&snapshot, &options, &mut |_, _| {}).into_iter().flatten().filter_map(|r| r.snapshot) {
            trace::load(&trace::to_pickle(&replayed)).expect("a replayed snapshot loads again");
        }
        trace::load(&trace::to_pickle(&snapshot)).expect("a snapshot written as a pickle loads again");
        trace::load(trace::to_json(&snapshot).as_bytes()).expect("a snapshot written as JSON loads again");
    }
});
