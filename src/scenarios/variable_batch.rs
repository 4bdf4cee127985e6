//! The variable-batch scenario (the one the page opens on): batched inference whose batch size
//! wobbles from step to step, and `tensormem demo`'s recording of it.

use super::{Kind, Parameter, Program, Recorder, Scenario, ScenarioInfo, Values};
use crate::alloc::AllocatorConfig;
use crate::device::SimOptions;
use crate::tensor::TensorError;
use crate::trace::{Category, Snapshot};
use crate::{DType, Device};

pub(super) fn scenario() -> Scenario {
    Scenario {
        info: ScenarioInfo {
            name: "variable-batch",
            title: "Variable batch sizes fragment the cache",
            explanation: "Batched inference whose batch size wobbles from step to step. Each batch needs activation blocks a little \
                          larger or smaller than the last; the cached blocks of earlier batches rarely fit, so the allocator reserves new \
                          segments and reserved memory drifts far above what is allocated (look at the gap between the two curves). \
                          The fix is PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): one segment \
                          that grows and shrinks in 20 MiB pages, so reserved memory follows what is live. Also try \
                          max_split_size_mb:64 as a what-if.",
            parameters: vec![
                Parameter::integer("layers", "8", 1, 1000, "MLP blocks (weights 2 x hidden x 4 hidden x 4 bytes each)"),
                // Sizes are bounded by what tensormem can index (variable_batch_fits), not here.
                Parameter::integer("hidden", "1024", 1, u64::MAX, "hidden size"),
                Parameter::integer("seq", "128", 1, u64::MAX, "tokens per sequence"),
                Parameter {
                    name: "batches",
                    default: DEFAULT_BATCHES,
                    help: "batch size of each step",
                    kind: Kind::Integers { min: 1, max: u64::MAX, max_len: 10_000 },
                },
            ],
            variants: vec!["mistake", "fix"],
        },
        check: variable_batch_fits,
        fix_settings: Some("expandable_segments:True"),
        program: Program::Sync(|rec, v| variable_batch(rec, v.u64("layers"), v.u64("hidden"), v.u64("seq"), &v.ints("batches"))),
    }
}

/// Every dimension must be an index (usize, 32 bits in wasm) and every tensor's bytes fit in 64
/// bits: a card too small is refused with an out-of-memory error, an overflow never.
fn variable_batch_fits(v: &Values) -> Result<super::Work, String> {
    let (hidden, seq) = (v.u64("hidden"), v.u64("seq"));
    let max_batch = v.ints("batches").into_iter().max().unwrap_or(1);
    let product = |factors: &[u64]| factors.iter().try_fold(1u64, |p, &f| p.checked_mul(f));
    let dims = [product(&[4, hidden]), product(&[max_batch, seq])];
    let bytes = [product(&[64, hidden, hidden]), product(&[80, max_batch, seq, hidden]), product(&[16, max_batch, seq, hidden, hidden])];
    if dims.iter().any(|d| d.is_none_or(|d| d > u32::MAX as u64)) || bytes.iter().any(Option::is_none) {
        return Err(format!("hidden={hidden}, seq={seq} and batch {max_batch} make tensors larger than tensormem can index"));
    }
    Ok(super::Work::product(&[("layers", v.u64("layers")), ("batches", v.ints("batches").len() as u64)]))
}

/// The variable-batch scenario's default batch sizes: a wobble around 32.
const DEFAULT_BATCHES: &str = "32,31,33,30,34,29,36,31,38,27,40,33";

/// Batched inference whose batch size wobbles from step to step: the pattern that expandable
/// segments were made for (PyTorch's Note [Expandable Segments]). Each step pushes a batch of
/// `seq`-token sequences through `layers` MLP blocks (fc1 to 4 x hidden, GELU in place, fc2
/// back); a slightly larger batch no longer fits the cached blocks of the previous ones, so
/// new segments pile up and reserved memory drifts above allocated.
fn variable_batch(rec: &mut Recorder, layers: u64, hidden: u64, seq: u64, batches: &[u64]) -> Result<(), TensorError> {
    let dev = rec.device.clone();
    let (hidden, wide) = (hidden as usize, 4 * hidden as usize);
    let mut weights = Vec::new();
    {
        let _parameters = dev.category(Category::Parameter);
        for layer in 0..layers {
            let _layer = dev.scope(&format!("layers.{layer}"));
            let fc1 = {
                let _fc1 = dev.scope("fc1");
                dev.randn(&[hidden, wide], DType::F32)?
            };
            let _fc2 = dev.scope("fc2");
            weights.push((fc1, dev.randn(&[wide, hidden], DType::F32)?));
        }
    }
    rec.step("weights loaded");
    for &batch in batches {
        let tokens = (batch * seq) as usize;
        let mut x = {
            let (_input, _scope) = (dev.category(Category::Input), dev.scope("input"));
            dev.randn(&[tokens, hidden], DType::F32)?
        };
        for (layer, (fc1, fc2)) in weights.iter().enumerate() {
            let _layer = dev.scope(&format!("layers.{layer}"));
            let h = {
                let _fc1 = dev.scope("fc1");
                let h = x.matmul(fc1)?;
                h.gelu_()?;
                h
            };
            let _fc2 = dev.scope("fc2");
            let y = h.matmul(fc2)?;
            // The wide activation is freed first, then the block's input (replaced by y).
            drop(h);
            x = y;
        }
        drop(x);
        rec.step(format!("batch {batch}"));
    }
    Ok(())
}

/// The variable-batch program with its default parameters under `config`, on a simulated H100
/// (with `capacity` instead of its 80 GB if given): `tensormem demo`'s recording.
pub fn variable_batch_inference(config: AllocatorConfig, capacity: Option<u64>) -> Result<Snapshot, TensorError> {
    let h100 = SimOptions::preset("H100-80GB");
    let card = SimOptions { capacity: capacity.unwrap_or(h100.capacity), ..h100 };
    let mut rec = Recorder::new(Device::sim_with(card, config));
    let batches: Vec<u64> = DEFAULT_BATCHES.split(',').map(|b| b.parse().expect("the default batches are numbers")).collect();
    variable_batch(&mut rec, 8, 1024, 128, &batches)?;
    Ok(rec.device.snapshot())
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
        // Peak live bytes: 16 x 16 MiB of weights, cuBLAS's workspace (32 MiB), then at batch
        // 40 an input (20 MiB), the fc1 activation (80 MiB) and the fc2 output (20 MiB) at
        // once: 408 MiB, 21 of the expandable segment's 20 MiB pages. It maps 23 (pinned from
        // the rules): the workspace stays where the first batch's matmul put it, between
        // blocks that batch frees, and splits the free space around it.
        assert_eq!(reserved(&expandable), 23 * 20 * MIB);
        // Classic segments keep every size that was once needed (pinned from the rules: 746 MiB,
        // the workspace's own 32 MiB segment among them).
        assert_eq!(reserved(&classic), 746 * MIB);
        assert!(reserved(&expandable) < reserved(&classic));
    }
}
