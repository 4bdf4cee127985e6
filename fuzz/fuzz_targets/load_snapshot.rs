//! Any bytes: loading must return Ok or a clear error, and whatever loads must replay and
//! re-serialize without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensormem::replay::{replay_snapshot, ReplayOptions};

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = tensormem::trace::load(data) {
        let _ = replay_snapshot(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
        let _ = tensormem::trace::to_pickle(&snapshot);
    }
});
