//! The seeds' memory techniques and the pitfalls around them, on small models any GPU runs:
//! carried RNN hidden states, a checkpointed result cached on the module, optimizer state,
//! gradient accumulation, activation checkpointing and mixed precision.

use super::{LocalFuture, Parameter, Program, Recorder, Scenario, ScenarioInfo, Values, Work, repeated_steps, token_batch};
use crate::amp;
use crate::autograd::checkpoint;
use crate::nn::optim::{Adam, GradScaler, Optimizer, Sgd};
use crate::nn::{Linear, Lm, LmConfig, LstmCell, Module};
use crate::tensor::{DType, Result, Tensor};
use crate::trace::Category;
use std::rc::Rc;

pub(super) fn scenarios() -> Vec<Scenario> {
    let scenario = |name, title, explanation, parameters: Vec<Parameter>, variants: bool, program: Program| Scenario {
        info: ScenarioInfo { name, title, explanation, parameters, variants: if variants { vec!["mistake", "fix"] } else { vec![] } },
        check: repeated_steps,
        fix_settings: None,
        program,
    };
    let steps = |default| Parameter::integer("steps", default, 1, 1000, "training steps (or batches)");
    rnn_counted(vec![
        scenario(
            "rnn-hidden",
            "An RNN's hidden state carried across batches keeps every batch's graph",
            "The LSTM's hidden and cell states are passed from batch to batch. Without detach() the new batch's graph \
             hangs off the previous one: backward would walk into the previous batch's freed graph (PyTorch's \"Trying to \
             backward through the graph a second time\"), so the usual workaround is backward(retain_graph=True), and then \
             every batch's activations stay: allocated grows by one batch's graph per step and each backward walks all of \
             them. The fix detaches the states at each batch start (truncated backpropagation through time): flat after \
             the first step. (Gradients accumulate over the batches here: an optimizer step between them would make the \
             retained graphs' saved weights stale, which PyTorch refuses with its in-place modification error.)",
            vec![
                Parameter::integer("batch", "32", 1, 65_536, "sequences per batch"),
                Parameter::integer("timesteps", "16", 1, 4096, "LSTM steps per batch"),
                Parameter::integer("hidden", "512", 1, 16_384, "hidden size (the input has half)"),
                // The mistake's backward k walks all k batches' graphs, as PyTorch's does: the
                // run's cost grows with the square of the steps (128 take seconds, 1000 minutes).
                Parameter::integer("steps", "4", 1, 128, "batches (at most 128: each backward of the mistake walks every earlier batch)"),
            ],
            true,
            Program::Sync(rnn_hidden),
        ),
        scenario(
            "cached-graph",
            "A checkpointed result cached on the module",
            "The model checkpoints its first layer to save memory, then stores the result on itself \
             (self.cached_intermediate = intermediate). The cached tensor outlives the step: its activation stays allocated \
             between steps, and during the next forward both the old and the new one are live. Checkpointing promised to \
             keep only the layer's input; the cache keeps its output too. The fix does not cache.",
            vec![Parameter::integer("batch", "64", 1, 65_536, "rows per batch"), Parameter::integer("width", "2048", 1, 65_536, "layer width"), steps("3")],
            true,
            Program::Sync(cached_graph),
        ),
        scenario(
            "optimizer-state",
            "What the optimizer keeps: SGD, momentum, Adam",
            "Plain SGD keeps nothing between steps; SGD with momentum keeps one buffer per parameter (a copy of the \
             first gradient); Adam and AdamW keep two (exp_avg and exp_avg_sq), allocated lazily at the first step, so the \
             first optimizer.step() is where memory jumps by 2 x the parameters. torch.optim's default foreach path also \
             holds a square root of every second moment at once during the step; foreach=false (the single-tensor loop) \
             holds only the largest parameter's square root and quotient (and the previous parameter's denominator).",
            vec![
                Parameter::choice("optimizer", "adam", &["sgd", "momentum", "adam"], "the optimizer"),
                Parameter::flag(
                    "foreach",
                    "true",
                    "adam: torch.optim's multi-tensor path (true, the CUDA default) or the single-tensor loop (false, foreach=False); \
                     sgd allocates the same either way",
                ),
                Parameter::integer("batch", "8", 1, 4096, "sequences per batch"),
                Parameter::integer("context", "128", 1, 8192, "tokens per sequence"),
                steps("2"),
            ],
            false,
            Program::Sync(optimizer_state),
        ),
        scenario(
            "grad-accumulation",
            "Gradient accumulation: one big batch vs micro-batches",
            "A batch too large for the card's activations can be split into micro-batches whose gradients accumulate in \
             .grad (loss / micro_batches, backward each, one optimizer step). The gradients take the same memory either way \
             (backward adds into them in place); the activations shrink by the number of micro-batches. The mistake runs \
             the whole batch at once; the fix runs micro-batches.",
            vec![
                Parameter::integer("batch", "32", 1, 4096, "the effective batch (sequences)"),
                Parameter::integer("micro_batches", "4", 1, 4096, "micro-batches per step (the fix)"),
                Parameter::integer("context", "128", 1, 8192, "tokens per sequence"),
                steps("2"),
            ],
            true,
            Program::Sync(grad_accumulation),
        ),
        scenario(
            "checkpointing",
            "Activation checkpointing: keep block inputs, recompute in backward",
            "Without checkpointing every block keeps what its ops save for backward (for this model a few dozen tensors of \
             batch x context x width, and the batch x heads x context^2 attention probabilities). Checkpointing each block \
             (torch.utils.checkpoint) keeps only the block's input and recomputes the block during backward: the forward \
             peak drops to one tensor per block, backward recomputes one block at a time.",
            vec![
                Parameter::integer("layers", "4", 1, 512, "transformer blocks"),
                Parameter::integer("batch", "8", 1, 4096, "sequences per batch"),
                Parameter::integer("context", "256", 1, 8192, "tokens per sequence"),
            ],
            true,
            Program::Sync(checkpointing),
        ),
        scenario(
            "mixed-precision",
            "Mixed precision: autocast and GradScaler, and the loss outside autocast",
            "Under autocast matmuls run in float16 (with float16 copies of the float32 weights cached for the scope) while \
             softmax, log, exp and the losses run in float32; GradScaler scales the loss, unscales the gradients and \
             skips steps that overflow. The seed's mistake computes the loss outside the autocast block: PyTorch then runs \
             the loss's ops in float16 on the float16 logits (less memory, less accuracy), where autocast would have copied \
             them to float32. Set amp=false for the float32 baseline.",
            vec![
                Parameter::flag("amp", "true", "autocast to float16 with a GradScaler (false: float32)"),
                Parameter::integer("batch", "8", 1, 4096, "sequences per batch"),
                Parameter::integer("context", "128", 1, 8192, "tokens per sequence"),
                steps("2"),
            ],
            true,
            Program::Async(mixed_precision),
        ),
    ])
}

/// A small language model of the `lm` family (vocabulary 1,000, width 256, 4 heads, 688 wide
/// feed-forward) and one batch of ids and next-token targets.
fn small_lm(rec: &mut Recorder, layers: usize, batch: usize, context: usize) -> Result<(Lm, Tensor, Tensor)> {
    let dev = rec.device.clone();
    let config = LmConfig { vocab: 1000, dim: 256, hidden: 688, layers, heads: 4, context, dtype: DType::F32 };
    let model = Lm::new(&dev, config)?;
    rec.model_parameters = Some(model.parameter_count());
    let (ids, targets) = token_batch(&dev, batch, context, 1000)?;
    rec.step("model and batch");
    Ok((model, ids, targets))
}

fn rnn_hidden(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let (batch, hidden) = (v.int("batch"), v.int("hidden"));
    let cell = LstmCell::new(&dev, "lstm", hidden / 2, hidden, DType::F32)?;
    rec.model_parameters = Some(cell.parameter_count());
    let mut optimizer = Sgd::new(cell.parameters(), 1e-3, 0.0, 0.0);
    let (mut h, mut c) = (dev.zeros(&[batch, hidden], DType::F32)?, dev.zeros(&[batch, hidden], DType::F32)?);
    rec.step("model and states");
    // Gradients accumulate over the batches; one optimizer step at the end (an update in
    // between would make the retained graphs' saved weights stale: PyTorch's in-place error).
    optimizer.zero_grad(true)?;
    for step in 1..=v.int("steps") {
        if v.fix() {
            (h, c) = (h.detach(), c.detach());
        }
        let inputs = {
            let _inputs = dev.category(Category::Input);
            dev.randn(&[v.int("timesteps"), batch, hidden / 2], DType::F32)?
        };
        for t in 0..v.int("timesteps") {
            (h, c) = cell.forward(&inputs.select(0, t)?, &h, &c)?;
        }
        let loss = h.pow_scalar(2.0)?.mean(&[], false)?;
        // The mistake's workaround for "backward through the graph a second time".
        loss.backward_with(None, !v.fix())?;
        rec.step(format!("batch {step}"));
    }
    optimizer.step()?;
    rec.step("optimizer.step()");
    Ok(())
}

fn cached_graph(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let (batch, width) = (v.int("batch"), v.int("width"));
    let layer = |name: &str| Linear::new(&dev, name, width, width, true, DType::F32).map(Rc::new);
    let (layer1, layer2) = (layer("layer1")?, layer("layer2")?);
    rec.model_parameters = Some(layer1.parameter_count() + layer2.parameter_count());
    let mut optimizer = Sgd::new(layer1.parameters().into_iter().chain(layer2.parameters()).collect(), 1e-3, 0.0, 0.0);
    let mut cached: Option<Tensor> = None;
    rec.step("model");
    for step in 1..=v.int("steps") {
        optimizer.zero_grad(true)?;
        let x = {
            let _inputs = dev.category(Category::Input);
            dev.randn(&[batch, width], DType::F32)?
        };
        // The reentrant checkpoint passes gradients only when an input requires grad: the
        // classic workaround marks the batch.
        x.requires_grad_(true)?;
        let (l1, l2) = (Rc::clone(&layer1), Rc::clone(&layer2));
        let intermediate = checkpoint(move |t| l1.forward(&t[0])?.tanh(), &[&x])?;
        if !v.fix() {
            // self.cached_intermediate = intermediate
            cached = Some(intermediate.share());
        }
        let out = checkpoint(move |t| l2.forward(&t[0])?.tanh(), &[&intermediate])?;
        drop(intermediate);
        rec.step(format!("step {step}: forward"));
        // Python frees `out.pow(2)` as soon as mean has its result, before backward.
        let loss = out.pow_scalar(2.0)?.mean(&[], false)?;
        loss.backward()?;
        drop(loss);
        optimizer.step()?;
        rec.step(format!("step {step}: backward and step"));
    }
    drop(cached);
    Ok(())
}

fn optimizer_state(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (model, ids, targets) = small_lm(rec, 4, v.int("batch"), v.int("context"))?;
    let mut optimizer: Box<dyn Optimizer> = match v.choice("optimizer") {
        "sgd" => Box::new(Sgd::new(model.parameters(), 1e-2, 0.0, 0.0)),
        "momentum" => Box::new(Sgd::new(model.parameters(), 1e-2, 0.9, 0.0)),
        _ => {
            let mut adam = Adam::new(model.parameters(), 1e-3, 0.0);
            adam.foreach = v.flag("foreach");
            Box::new(adam)
        }
    };
    for step in 1..=v.int("steps") {
        optimizer.zero_grad(true)?;
        // `net.loss(net(ids), targets).backward()`: Python lets the logits go when loss returns.
        let loss = {
            let logits = model.forward(&ids)?;
            model.loss(&logits, &targets)?
        };
        loss.backward()?;
        drop(loss);
        rec.step(format!("step {step}: backward"));
        optimizer.step()?;
        rec.step(format!("step {step}: optimizer.step()"));
    }
    Ok(())
}

fn grad_accumulation(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (batch, context) = (v.int("batch"), v.int("context"));
    let micro_batches = if v.fix() { v.int("micro_batches").min(batch) } else { 1 };
    let (model, ids, targets) = small_lm(rec, 4, batch, context)?;
    let mut optimizer = Adam::adamw(model.parameters(), 1e-3, 0.01);
    // Micro-batch k takes rows [k * rows, (k + 1) * rows) (the last takes the rest).
    let rows = batch / micro_batches;
    for step in 1..=v.int("steps") {
        optimizer.zero_grad(true)?;
        for k in 0..micro_batches {
            let len = if k + 1 == micro_batches { batch - k * rows } else { rows };
            let (ids, targets) = (ids.narrow(0, k * rows, len)?, targets.narrow(0, k * rows, len)?);
            let loss = model.loss(&model.forward(&ids)?, &targets)?.div_scalar(micro_batches as f64)?;
            loss.backward()?;
            rec.step(format!("step {step}: micro-batch {} backward", k + 1));
        }
        optimizer.step()?;
        rec.step(format!("step {step}: optimizer.step()"));
    }
    Ok(())
}

fn checkpointing(rec: &mut Recorder, v: &Values) -> Result<()> {
    let (mut model, ids, targets) = small_lm(rec, v.int("layers"), v.int("batch"), v.int("context"))?;
    model.checkpointing = v.fix();
    let mut optimizer = Adam::adamw(model.parameters(), 1e-3, 0.01);
    let logits = model.forward(&ids)?;
    rec.step("forward");
    let loss = model.loss(&logits, &targets)?;
    rec.step("loss");
    loss.backward()?;
    rec.step("backward");
    optimizer.step()?;
    rec.step("optimizer step");
    Ok(())
}

fn mixed_precision<'a>(rec: &'a mut Recorder, v: &'a Values) -> LocalFuture<'a> {
    Box::pin(async move {
        let (model, ids, targets) = small_lm(rec, 4, v.int("batch"), v.int("context"))?;
        let mut optimizer = Adam::adamw(model.parameters(), 1e-3, 0.01);
        let mut scaler = v.flag("amp").then(GradScaler::new);
        for step in 1..=v.int("steps") {
            optimizer.zero_grad(true)?;
            let autocast = scaler.is_some().then(|| amp::autocast(DType::F16)).transpose()?;
            let logits = model.forward(&ids)?;
            rec.step(format!("step {step}: forward"));
            let loss = if v.fix() {
                let loss = model.loss(&logits, &targets)?;
                drop(autocast);
                loss
            } else {
                // The seed's mistake: the loss after the autocast block.
                drop(autocast);
                model.loss(&logits, &targets)?
            };
            rec.step(format!("step {step}: loss"));
            match &mut scaler {
                Some(scaler) => {
                    scaler.scale(&loss)?.backward()?;
                    rec.step(format!("step {step}: backward"));
                    scaler.step(&mut optimizer).await?;
                    scaler.update().await?;
                }
                None => {
                    loss.backward()?;
                    rec.step(format!("step {step}: backward"));
                    optimizer.step()?;
                }
            }
            rec.step(format!("step {step}: optimizer step"));
        }
        Ok(())
    })
}

/// rnn-hidden's work: an LSTM step per timestep per batch, and without detach (the mistake) each
/// backward walks every earlier batch's graph too: steps x (steps + 1) / 2 batches' worth.
fn rnn_counted(mut scenarios: Vec<Scenario>) -> Vec<Scenario> {
    fn rnn_work(v: &Values) -> std::result::Result<Work, String> {
        let (steps, timesteps) = (v.u64("steps"), v.u64("timesteps"));
        let walked = if v.fix() { steps } else { steps * (steps + 1) / 2 };
        Ok(Work::product(&[("batches walked by backward", walked), ("timesteps", timesteps)]))
    }
    for scenario in scenarios.iter_mut().filter(|s| s.info.name == "rnn-hidden") {
        scenario.check = rnn_work;
    }
    scenarios
}
