//! Named workloads. For now, allocator-level programs (a sequence of tensor-sized requests with
//! stacks); tensor-level scenarios from the seed articles arrive with the engine.

use crate::alloc::{AllocError, AllocatorConfig, RecordContext, VirtualAllocator};
use crate::trace::{Frame, Frames, Snapshot};
use std::sync::Arc;

fn frames(name: &str, line: u64) -> Frames {
    Arc::from(vec![Frame { filename: "src/scenarios/mod.rs".into(), line, name: name.into() }])
}

/// Batched inference whose batch size wobbles from step to step: the pattern that expandable
/// segments were made for (PyTorch's Note [Expandable Segments]). Each step pushes activations
/// through `layers` MLP blocks; a slightly larger batch no longer fits the cached blocks of the
/// previous ones, so new segments pile up and reserved memory drifts above allocated.
pub fn variable_batch_inference(config: AllocatorConfig, capacity: Option<u64>) -> Result<Snapshot, AllocError> {
    const SEQ: u64 = 128;
    const HIDDEN: u64 = 1024;
    const LAYERS: usize = 8;
    let mut a = VirtualAllocator::virtual_with(config);
    a.set_capacity(capacity);
    a.record_memory_history(true, RecordContext::All, 1 << 20);
    let mut weights = Vec::new();
    for layer in 0..LAYERS {
        let f = frames(&format!("layers.{layer}.weights"), 20);
        weights.push(a.malloc(2 * HIDDEN * 4 * HIDDEN * 4, 0, Some(f))?);
    }
    for batch in [32u64, 31, 33, 30, 34, 29, 36, 31, 38, 27, 40, 33] {
        let activation = batch * SEQ * HIDDEN * 4;
        let mut x = a.malloc(activation, 0, Some(frames("input", 30)))?;
        for layer in 0..LAYERS {
            let hidden = a.malloc(4 * activation, 0, Some(frames(&format!("layers.{layer}.fc1"), 33)))?;
            let y = a.malloc(activation, 0, Some(frames(&format!("layers.{layer}.fc2"), 34)))?;
            a.free(hidden.ptr, None)?;
            a.free(x.ptr, None)?;
            x = y;
        }
        a.free(x.ptr, None)?;
    }
    Ok(a.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_reserve_less_for_variable_batches() {
        let classic = variable_batch_inference(AllocatorConfig::default(), None).unwrap();
        let expandable = variable_batch_inference(AllocatorConfig::parse("expandable_segments:True").unwrap(), None).unwrap();
        let reserved = |s: &Snapshot| s.segments.iter().map(|s| s.total_size).sum::<u64>();
        const MIB: u64 = 1 << 20;
        // Peak live bytes: 8 x 32 MiB of weights, then at batch 40 an input (20 MiB), the fc1
        // activation (80 MiB) and the fc2 output (20 MiB) at once: 376 MiB. One expandable segment
        // holds exactly that, in 20 MiB pages: 19 pages.
        assert_eq!(reserved(&expandable), 19 * 20 * MIB);
        // Classic segments keep every size that was once needed (pinned from the rules: 714 MiB).
        assert_eq!(reserved(&classic), 714 * MIB);
        assert!(reserved(&expandable) < reserved(&classic));
    }
}
