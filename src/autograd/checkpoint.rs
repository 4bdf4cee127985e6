//! Activation checkpointing: `torch.utils.checkpoint.checkpoint(f, *inputs)` (the reentrant
//! form). The forward runs without recording, so nothing inside `f` is saved; the output's node
//! keeps only the inputs. Its backward runs `f` again, with grad enabled and the random state
//! the forward had (dropout draws the same masks), and backpropagates through the recomputed
//! graph: memory traded for a second forward.

use crate::tensor::graph::{Save, enable_grad, no_grad, record, records};
use crate::tensor::{Result, Tensor, TensorError};
use std::rc::Rc;

/// Runs `f(inputs)` checkpointed. Gradients reach the inputs that require grad and every
/// tensor `f` uses that requires grad (parameters accumulate during the recomputation).
#[track_caller]
pub fn checkpoint<F>(f: F, inputs: &[&Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + 'static,
{
    let device = inputs.first().ok_or_else(|| TensorError::Shape("checkpoint needs at least one input".into()))?.device().clone();
    let rng = device.rng_state();
    let out = {
        let _no_grad = no_grad();
        // As torch/utils/checkpoint.py on PyTorch's stacks: the forward run under it shows.
        let _scope = device.scope("checkpoint");
        f(&inputs.iter().map(|t| t.share()).collect::<Vec<_>>())?
    };
    // As PyTorch's reentrant checkpoint: with no input requiring grad, nothing flows back.
    if !records(inputs) {
        return Ok(out);
    }
    let need: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
    let save: Vec<Option<Save>> = inputs.iter().map(|t| Some(Save::Input(t))).collect();
    let f = Rc::new(f);
    Ok(record(
        "CheckpointFunctionBackward",
        inputs,
        out,
        &save,
        Box::new(move |saved, g| {
            let detached: Vec<Tensor> = saved.iter().map(|s| s.as_ref().expect("saved").detach()).collect();
            for (t, &need) in detached.iter().zip(&need) {
                t.requires_grad_(need)?;
            }
            let recomputed = {
                let _grad = enable_grad();
                let now = device.rng_state();
                device.set_rng_state(rng);
                let out = f(&detached);
                device.set_rng_state(now);
                out?
            };
            recomputed.backward_with(Some(g), false)?;
            Ok(detached.iter().map(Tensor::grad).collect())
        }),
    ))
}
