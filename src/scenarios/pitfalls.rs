//! The training pitfalls of the seed articles, each as a mistake and its fix on a small
//! Llama-style language model: what the graph, the gradients and the optimizer keep alive.

use super::{Parameter, Program, Recorder, Scenario, ScenarioInfo, Values, repeated_steps, token_batch};
use crate::autograd;
use crate::nn::optim::{Optimizer, Sgd};
use crate::nn::{Architecture, Module, Transformer, TransformerConfig};
use crate::tensor::{DType, Result, Tensor};

/// The model every pitfall trains: small enough for any GPU, large enough that its activations
/// show (4 layers of width 256, 3.7 M parameters).
pub(super) fn model_parameters() -> Vec<Parameter> {
    vec![
        Parameter::integer("batch", "8", 1, 4096, "sequences per batch"),
        Parameter::integer("context", "128", 1, 8192, "tokens per sequence"),
        Parameter::integer("steps", "4", 1, 1000, "training steps (or batches)"),
    ]
}

/// The pitfalls' model: a Llama of 4 layers of width 256 over a vocabulary of 1000.
pub(super) fn small_llama(dev: &crate::Device, context: usize) -> Result<Transformer> {
    let config = TransformerConfig {
        architecture: Architecture::Llama,
        vocab: 1000,
        context,
        dim: 256,
        layers: 4,
        heads: 4,
        hidden: 688,
        dropout: 0.0,
        dtype: DType::F32,
    };
    Transformer::new(dev, config)
}

/// Builds the model and one batch of token ids and next-token targets.
pub(super) fn model(rec: &mut Recorder, v: &Values) -> Result<(Transformer, Tensor, Tensor)> {
    let dev = rec.device.clone();
    let (batch, context) = (v.int("batch"), v.int("context"));
    let model = small_llama(&dev, context)?;
    rec.model_parameters = Some(model.parameter_count());
    let (ids, targets) = token_batch(&dev, batch, context, 1000)?;
    rec.step("model and batch");
    Ok((model, ids, targets))
}

pub(super) fn scenarios() -> Vec<Scenario> {
    let scenario = |name, title, explanation, extra: Vec<Parameter>, program| Scenario {
        info: ScenarioInfo { name, title, explanation, parameters: model_parameters().into_iter().chain(extra).collect(), variants: vec!["mistake", "fix"] },
        check: repeated_steps,
        fix_settings: None,
        program: Program::Sync(program),
    };
    vec![
        scenario(
            "eval-no-grad",
            "Evaluation without no_grad builds a graph for nothing",
            "Validation batches run forward only, but with grad mode on every op still records a node and keeps what \
             its backward would need (the activations of every layer), until the loss is overwritten by the next batch. \
             Under torch.no_grad() (or torch.inference_mode(), the same memory here) nothing is saved: only the \
             parameters and the current batch's outputs live. Compare allocated after each batch.",
            vec![Parameter::choice("guard", "no_grad", &["no_grad", "inference_mode"], "the fix's guard")],
            eval_no_grad,
        ),
        scenario(
            "loss-history",
            "Keeping the loss tensor instead of loss.item()",
            "losses.append(loss) keeps the 0-d loss tensor (a 512-byte block, the allocator's smallest) and, through its \
             grad_fn, the whole graph's nodes. After backward the graph's saved activations are already freed, so a \
             training loop grows by one block per step; a loop that never calls backward (validation with grad on) \
             keeps every step's activations. losses.append(loss.item()) keeps a Python float: memory stays flat after \
             the first step.",
            vec![Parameter::flag("backward", "true", "call loss.backward() each step (false: a forward-only loop)")],
            loss_history,
        ),
        scenario(
            "zero-grad",
            "Forgetting zero_grad, and set_to_none",
            "Without optimizer.zero_grad() each backward adds into the existing .grad tensors in place: the memory \
             does not grow (contrary to a common claim), the gradients do, silently summing every step. zero_grad() \
             with set_to_none=True (PyTorch's default) frees every gradient block between steps, so allocated drops by \
             the gradients' size until backward makes them again; set_to_none=False keeps the blocks and fills them \
             with zeros.",
            vec![Parameter::flag("set_to_none", "true", "the fix's zero_grad(set_to_none)")],
            zero_grad,
        ),
        scenario(
            "grad-fn-history",
            "Storing grad_fn keeps every graph alive",
            "Appending output.grad_fn (or the output) to a list in a loop that never calls backward keeps each step's \
             graph, and with it every tensor the graph saved for backward: memory grows by one forward's activations \
             per step. Dropping the reference (or running under no_grad when no gradient is needed) frees each graph \
             as soon as the next step replaces it.",
            vec![],
            grad_fn_history,
        ),
    ]
}

fn eval_no_grad(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (model, ids, targets) = model(rec, v)?;
    let _guard = match (v.fix(), v.choice("guard")) {
        (false, _) => None,
        (true, "inference_mode") => Some(autograd::inference_mode()),
        (true, _) => Some(autograd::no_grad()),
    };
    let mut val_loss = None;
    for batch in 1..=v.int("steps") {
        val_loss = Some(model.loss(&ids, &targets, false)?);
        rec.step(format!("validation batch {batch}"));
    }
    drop(val_loss);
    Ok(())
}

fn loss_history(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (model, ids, targets) = model(rec, v)?;
    let mut optimizer = Sgd::new(model.parameters(), 1e-3, 0.0, 0.0);
    let mut losses = Vec::new();
    for step in 1..=v.int("steps") {
        optimizer.zero_grad(true)?;
        let loss = model.loss(&ids, &targets, true)?;
        if v.flag("backward") {
            loss.backward()?;
            optimizer.step()?;
        }
        // The fix keeps loss.item(), a host number: the tensor goes.
        if !v.fix() {
            losses.push(loss);
        }
        rec.step(format!("step {step}: {} kept", if v.fix() { "loss.item()" } else { "loss" }));
    }
    Ok(())
}

fn zero_grad(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (model, ids, targets) = model(rec, v)?;
    let mut optimizer = Sgd::new(model.parameters(), 1e-3, 0.0, 0.0);
    for step in 1..=v.int("steps") {
        if v.fix() {
            optimizer.zero_grad(v.flag("set_to_none"))?;
            rec.step(format!("step {step}: zero_grad(set_to_none={})", v.flag("set_to_none")));
        }
        model.loss(&ids, &targets, true)?.backward()?;
        rec.step(format!("step {step}: backward"));
        optimizer.step()?;
        rec.step(format!("step {step}: optimizer.step()"));
    }
    Ok(())
}

fn grad_fn_history(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (model, ids, targets) = model(rec, v)?;
    let mut graphs = Vec::new();
    for step in 1..=v.int("steps") {
        let output = model.loss(&ids, &targets, true)?;
        if !v.fix() {
            graphs.push(output.grad_fn());
        }
        drop(output);
        rec.step(format!("step {step}: {}", if v.fix() { "output dropped" } else { "graph_stats.append(output.grad_fn)" }));
    }
    Ok(())
}
