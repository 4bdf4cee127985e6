//! Replaying real PyTorch traces reproduces PyTorch's decisions.

mod common;

use tensormem::replay::{replay_snapshot, ReplayOptions};
use tensormem::trace;

#[test]
fn print_fixture_replays() {
    let Some(dir) = common::fixtures_dir() else { return };
    for name in common::FIXTURES {
        let snap = trace::load_file(&dir.join(name)).unwrap();
        let results = replay_snapshot(&snap, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        for r in results {
            eprintln!(
                "{name} dev {}: events {} seg_match {:.4} addr {:.4} final {} peak rec {} rep {} div {:?} warn {:?}",
                r.device, r.events, r.segment_alloc_match, r.address_match, r.final_state_match,
                r.recorded.peak_reserved_bytes, r.replayed.figures.peak_reserved_bytes, r.first_divergence, r.warnings
            );
        }
    }
}
