//! Optimizers with PyTorch's memory: state allocated lazily at the first step (tagged
//! `optimizer_state`), and the temporaries of PyTorch's default CUDA path, the `foreach`
//! (multi-tensor) implementation, which works op by op across all parameters: Adam's
//! `_foreach_sqrt` holds a square-root copy of every parameter's second moment at once. Adam's
//! single-tensor path (`foreach=False`) goes one parameter at a time instead.

mod scaler;

pub use scaler::GradScaler;

use crate::autograd;
use crate::device::Device;
use crate::tensor::{DType, Result, Tensor, TensorError};
use crate::trace::Category;

/// What every optimizer does.
pub trait Optimizer {
    fn params(&self) -> &[Tensor];

    /// Its class name, as PyTorch's `record_function` range names the step
    /// (`Optimizer.step#SGD.step`).
    fn name(&self) -> &'static str;

    /// One update from the parameters' `.grad` (parameters without one are skipped).
    fn update(&mut self) -> Result<()>;

    /// `optimizer.step()`: the update, inside the range torch.optim records around every
    /// optimizer's step (the trace then shows the step even where it allocates nothing).
    fn step(&mut self) -> Result<()> {
        let name = format!("Optimizer.step#{0}.step", self.name());
        let _range = self.params().first().map(|p| p.device().record_function(&name));
        self.update()
    }

    /// `zero_grad(set_to_none)`: True (PyTorch's default) frees every gradient; False keeps
    /// the blocks and fills them with zeros.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.params() {
            if set_to_none {
                p.set_grad(None);
            } else if let Some(g) = p.grad() {
                let _no_grad = autograd::no_grad();
                g.zero_()?;
            }
        }
        Ok(())
    }
}

/// An optimizer over float32 master copies of 16-bit parameters (DeepSpeed's bf16 and fp16
/// modes, Megatron's distributed optimizer): the copies are made when it is built, each step
/// casts the gradients into float32 gradients it keeps (made at the first step), runs the
/// inner optimizer on the copies and copies them back into the parameters; the 16-bit
/// gradients are freed once upcast. Per parameter element that is 4 bytes of copy and 4 of
/// gradient besides the inner optimizer's state.
pub struct MasterWeights {
    params: Vec<Tensor>,
    /// Each 16-bit parameter's float32 copy; None for a float32 parameter (a LoRA adapter over
    /// a 16-bit base), which the inner optimizer steps itself.
    masters: Vec<Option<Tensor>>,
    inner: Box<dyn Optimizer>,
}

impl MasterWeights {
    pub fn new(params: Vec<Tensor>, inner: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer>) -> Result<MasterWeights> {
        let _no_grad = autograd::no_grad();
        let masters = params
            .iter()
            .map(|p| {
                let _state = p.device().category(Category::OptimizerState);
                (p.dtype() != DType::F32).then(|| p.to(DType::F32)).transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let stepped = params.iter().zip(&masters).map(|(p, m)| m.as_ref().unwrap_or(p).share()).collect();
        Ok(MasterWeights { inner: inner(stepped), params, masters })
    }
}

impl Optimizer for MasterWeights {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn update(&mut self) -> Result<()> {
        let copies = || self.params.iter().zip(&self.masters).filter_map(|(p, m)| m.as_ref().map(|m| (p, m)));
        {
            let _no_grad = autograd::no_grad();
            for (p, master) in copies() {
                let Some(grad) = p.grad() else { continue };
                match master.grad() {
                    Some(kept) => {
                        kept.copy_(&grad)?;
                    }
                    None => {
                        let _gradient = p.device().category(Category::Gradient);
                        master.set_grad(Some(grad.to(DType::F32)?));
                    }
                }
                // Upcast, the 16-bit gradient goes (DeepSpeed frees it once copied).
                p.set_grad(None);
            }
        }
        self.inner.update()?;
        let _no_grad = autograd::no_grad();
        for (p, master) in copies() {
            if master.grad().is_some() {
                p.copy_(master)?;
            }
        }
        Ok(())
    }
}

/// The parameters that have a gradient, with it.
fn with_grads(params: &[Tensor]) -> Vec<(usize, Tensor, Tensor)> {
    params.iter().enumerate().filter_map(|(i, p)| p.grad().map(|g| (i, p.share(), g))).collect()
}

/// `torch.optim.SGD(params, lr, momentum, weight_decay)` (no dampening, no Nesterov).
pub struct Sgd {
    params: Vec<Tensor>,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    /// One per parameter, made at its first step with momentum (a clone of its gradient).
    momentum_buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    pub fn new(params: Vec<Tensor>, lr: f64, momentum: f64, weight_decay: f64) -> Sgd {
        let momentum_buffers = params.iter().map(|_| None).collect();
        Sgd { params, lr, momentum, weight_decay, momentum_buffers }
    }
}

impl Optimizer for Sgd {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn name(&self) -> &'static str {
        "SGD"
    }

    /// `_multi_tensor_sgd`: weight decay makes new gradients (`_foreach_add`), a missing
    /// momentum buffer is a clone of the gradient, then `param -= lr * update`.
    fn update(&mut self) -> Result<()> {
        let _no_grad = autograd::no_grad();
        let group = with_grads(&self.params);
        let device = match group.first() {
            Some((_, p, _)) => p.device().clone(),
            None => return Ok(()),
        };
        let mut updates: Vec<Tensor> = if self.weight_decay != 0.0 {
            group.iter().map(|(_, p, g)| g.add(&p.mul_scalar(self.weight_decay)?)).collect::<Result<_>>()?
        } else {
            group.iter().map(|(_, _, g)| g.share()).collect()
        };
        if self.momentum != 0.0 {
            let _state = device.category(Category::OptimizerState);
            for ((i, _, _), update) in group.iter().zip(updates.iter_mut()) {
                let buffer = match &self.momentum_buffers[*i] {
                    Some(buffer) => {
                        buffer.mul_scalar_(self.momentum)?.add_(update)?;
                        buffer.share()
                    }
                    None => {
                        let buffer = update.clone()?;
                        self.momentum_buffers[*i] = Some(buffer.share());
                        buffer
                    }
                };
                *update = buffer;
            }
        }
        for ((_, p, _), update) in group.iter().zip(&updates) {
            p.add_scaled_(update, -self.lr)?;
        }
        Ok(())
    }
}

/// Adam's per-parameter state: the first and second moments, each a zeros_like of the
/// parameter. (PyTorch's `step` counter is a CPU tensor unless capturable: no device memory.)
struct AdamState {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    steps: u64,
    /// `state["step"]` on the device (fused: `torch.zeros((), dtype=float32, device=p.device)`).
    _step: Option<Tensor>,
}

/// `torch.optim.Adam` and `AdamW` (`decoupled_weight_decay`), PyTorch's defaults: betas
/// (0.9, 0.999), eps 1e-8; the foreach path (`_multi_tensor_adam`) unless `foreach` is false
/// (`_single_tensor_adam`). `capturable`, `differentiable`, `amsgrad` and `maximize` are
/// PyTorch's defaults, false.
pub struct Adam {
    params: Vec<Tensor>,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW: weight decay scales the parameters instead of adding to the gradients.
    pub decoupled_weight_decay: bool,
    pub foreach: bool,
    /// `fused=True` (`_fused_adam` / `_fused_adamw`): one kernel per device and type updates
    /// every parameter in place; the state holds a float32 `step` tensor per parameter on the
    /// device. Simulated only (tensormem has no fused kernel).
    pub fused: bool,
    state: Vec<Option<AdamState>>,
}

impl Adam {
    /// `torch.optim.Adam(params, lr)`.
    pub fn new(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> Adam {
        let state = params.iter().map(|_| None).collect();
        Adam { params, lr, betas: (0.9, 0.999), eps: 1e-8, weight_decay, decoupled_weight_decay: false, foreach: true, fused: false, state }
    }

    /// `torch.optim.AdamW(params, lr, weight_decay)` (PyTorch's default weight decay is 0.01).
    pub fn adamw(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> Adam {
        Adam { decoupled_weight_decay: true, ..Adam::new(params, lr, weight_decay) }
    }
}

impl Optimizer for Adam {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn name(&self) -> &'static str {
        if self.decoupled_weight_decay { "AdamW" } else { "Adam" }
    }

    fn update(&mut self) -> Result<()> {
        let _no_grad = autograd::no_grad();
        let group = with_grads(&self.params);
        let Some((_, first, _)) = group.first() else { return Ok(()) };
        let device = first.device().clone();
        {
            // Lazy state, as `_init_group`: each new parameter's exp_avg, then its exp_avg_sq.
            // Fused: `state["step"]` first, a float32 scalar on the device
            // (`_get_scalar_dtype(is_fused=True)`); otherwise a CPU tensor.
            if self.fused && !device.is_sim() {
                return Err(TensorError::Unsupported(
                    "optimizer=adamw-fused is simulated only (tensormem has no fused Adam kernel): run on a sim: device, or use adamw".into(),
                ));
            }
            let _state = device.category(Category::OptimizerState);
            for (i, p, _) in &group {
                if self.state[*i].is_none() {
                    let step = if self.fused { Some(p.device().zeros(&[], crate::tensor::DType::F32)?) } else { None };
                    self.state[*i] = Some(AdamState {
                        exp_avg: p.device().zeros(p.shape(), p.dtype())?,
                        exp_avg_sq: p.device().zeros(p.shape(), p.dtype())?,
                        steps: 0,
                        _step: step,
                    });
                }
            }
        }
        let (beta1, beta2) = self.betas;
        // The stepped parameters' states, in the group's order (which is the parameters').
        let picked: Vec<usize> = group.iter().map(|(i, _, _)| *i).collect();
        let mut states: Vec<&mut AdamState> =
            self.state.iter_mut().enumerate().filter(|(i, _)| picked.contains(i)).map(|(_, s)| s.as_mut().expect("made above")).collect();
        for s in states.iter_mut() {
            s.steps += 1;
        }
        let (lr, wd, eps) = (self.lr, self.weight_decay, self.eps);
        // Coupled weight decay makes new gradients, `grad.add(param, alpha=weight_decay)`;
        // decoupled (AdamW) scales each parameter in place by 1 - lr x weight_decay.
        let coupled = wd != 0.0 && !self.decoupled_weight_decay;
        let decoupled = wd != 0.0 && self.decoupled_weight_decay;
        if self.fused {
            // `_fused_adamw`: `torch._foreach_add_(state_steps, 1)`, then `torch._fused_adamw_`
            // updates parameters and moments in place: nothing allocated. (The sim device
            // computes with shapes only; the in-place ops below stand for the kernel.)
            for ((_, p, g), s) in group.iter().zip(&states) {
                if let Some(step) = &s._step {
                    step.add_scalar_(1.0)?;
                }
                if decoupled {
                    p.mul_scalar_(1.0 - lr * wd)?;
                }
                s.exp_avg.lerp_(g, 1.0 - beta1)?;
                s.exp_avg_sq.mul_scalar_(beta2)?.addcmul_(g, g, 1.0 - beta2)?;
                p.addcdiv_(&s.exp_avg, &s.exp_avg_sq, -lr)?;
            }
            return Ok(());
        }
        let step_size = |s: &AdamState| lr / (1.0 - beta1.powi(s.steps as i32));
        let correction2_sqrt = |s: &AdamState| (1.0 - beta2.powi(s.steps as i32)).sqrt();
        if !self.foreach {
            // `_single_tensor_adam`: one parameter after the other, with Python's locals: the
            // coupled decay's new gradient lives until the next `grad = grads[i]`, and the
            // denominator `(exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` until the next
            // one is assigned, after its square root and quotient are made (so at a parameter
            // of S bytes its square root, its quotient and the previous parameter's denominator
            // are live at once); the last ones until the step returns.
            let (mut grad, mut denominator): (Option<Tensor>, Option<Tensor>);
            denominator = None;
            for ((_, p, g), s) in group.iter().zip(&states) {
                grad = None; // `grad = grads[i]`: the previous parameter's decayed gradient goes first.
                let grad = grad.insert(if coupled { g.add_scaled(p, wd)? } else { g.share() });
                if decoupled {
                    p.mul_scalar_(1.0 - lr * wd)?;
                }
                s.exp_avg.lerp_(grad, 1.0 - beta1)?;
                s.exp_avg_sq.mul_scalar_(beta2)?.addcmul_(grad, grad, 1.0 - beta2)?;
                let quotient = s.exp_avg_sq.sqrt()?.div_scalar(correction2_sqrt(s))?;
                quotient.add_scalar_(eps)?;
                let denominator = denominator.insert(quotient);
                p.addcdiv_(&s.exp_avg, denominator, -step_size(s))?;
            }
            return Ok(());
        }
        // `_multi_tensor_adam`: op by op across every parameter.
        let grads: Vec<Tensor> =
            if coupled { group.iter().map(|(_, p, g)| g.add_scaled(p, wd)).collect::<Result<_>>()? } else { group.iter().map(|(_, _, g)| g.share()).collect() };
        if decoupled {
            for (_, p, _) in &group {
                p.mul_scalar_(1.0 - lr * wd)?;
            }
        }
        for (s, g) in states.iter().zip(&grads) {
            s.exp_avg.lerp_(g, 1.0 - beta1)?;
        }
        for s in &states {
            s.exp_avg_sq.mul_scalar_(beta2)?;
        }
        for (s, g) in states.iter().zip(&grads) {
            s.exp_avg_sq.addcmul_(g, g, 1.0 - beta2)?;
        }
        drop(grads);
        // `_foreach_sqrt`: every denominator at once.
        let denominators = states.iter().map(|s| s.exp_avg_sq.sqrt()).collect::<Result<Vec<_>>>()?;
        for (d, s) in denominators.iter().zip(&states) {
            d.div_scalar_(correction2_sqrt(s))?;
        }
        for d in &denominators {
            d.add_scalar_(eps)?;
        }
        for ((_, p, _), (s, d)) in group.iter().zip(states.iter().zip(&denominators)) {
            p.addcdiv_(&s.exp_avg, d, -step_size(s))?;
        }
        Ok(())
    }
}

/// bitsandbytes' `AdamW8bit` (`Optimizer2State` with `optim_bits=8`, `block_wise=True`,
/// `min_8bit_size=4096`, `percentile_clipping=100`, `max_unorm=0`), after bitsandbytes 0.49.2
/// `optim/optimizer.py` `init_state`: a parameter of fewer than 4,096 elements keeps two
/// float32 states (`torch.zeros_like(p, dtype=float32)`); a larger one two uint8 states
/// (`zeros_like(p, dtype=uint8)`) and a float32 absmax per 256-element block for each
/// (`torch.zeros((blocks,), float32)`), and the first such parameter moves the signed and
/// unsigned dynamic maps (256 float32 each) to the device. `state["step"]` is a Python int.
/// `update_step` runs `optimizer_update_8bit_blockwise` (or `optimizer_update_32bit`) in
/// place: the step allocates nothing. Simulated only (tensormem has no 8-bit kernels).
pub struct AdamW8bit {
    params: Vec<Tensor>,
    pub lr: f64,
    pub weight_decay: f64,
    state: Vec<Option<Vec<Tensor>>>,
    /// `name2qmap["dynamic"]` and `["udynamic"]`, on the device once a state is 8-bit.
    qmaps: Vec<Tensor>,
}

/// `min_8bit_size`: parameters with fewer elements keep 32-bit state.
pub const MIN_8BIT_SIZE: usize = 4096;
/// The block of the 8-bit blockwise states (`init_state`'s `blocksize = 256`).
pub const BLOCKSIZE_8BIT: usize = 256;

impl AdamW8bit {
    /// `bnb.optim.AdamW8bit(params, lr, weight_decay)` (its default weight decay is 0.01).
    pub fn new(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> AdamW8bit {
        let state = params.iter().map(|_| None).collect();
        AdamW8bit { params, lr, weight_decay, state, qmaps: Vec::new() }
    }

    /// The state bytes of a parameter of `n` elements (exact, without allocator rounding).
    pub fn state_bytes(n: u64) -> u64 {
        if n < MIN_8BIT_SIZE as u64 { 2 * 4 * n } else { 2 * n + 2 * 4 * n.div_ceil(BLOCKSIZE_8BIT as u64) }
    }
}

impl Optimizer for AdamW8bit {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn name(&self) -> &'static str {
        "AdamW8bit"
    }

    fn update(&mut self) -> Result<()> {
        use crate::tensor::DType;
        let _no_grad = autograd::no_grad();
        for (p, state) in self.params.iter().zip(self.state.iter_mut()) {
            let Some(_grad) = p.grad() else { continue };
            let device = p.device().clone();
            if !device.is_sim() {
                return Err(TensorError::Unsupported(
                    "optimizer=adamw8bit is simulated only (tensormem has no bitsandbytes kernels): run on a sim: device, or use adamw".into(),
                ));
            }
            if state.is_none() {
                let _state = device.category(Category::OptimizerState);
                let n = p.numel();
                *state = Some(if n < MIN_8BIT_SIZE {
                    vec![device.zeros(p.shape(), DType::F32)?, device.zeros(p.shape(), DType::F32)?]
                } else {
                    if self.qmaps.is_empty() {
                        // fill_qmap() on the CPU, then `.to(p.device)`: dynamic, then udynamic.
                        self.qmaps = vec![device.empty(&[256], DType::F32)?, device.empty(&[256], DType::F32)?];
                    }
                    let blocks = n.div_ceil(BLOCKSIZE_8BIT);
                    vec![
                        device.zeros(p.shape(), DType::U8)?,
                        device.zeros(p.shape(), DType::U8)?,
                        device.zeros(&[blocks], DType::F32)?,
                        device.zeros(&[blocks], DType::F32)?,
                    ]
                });
            }
            // optimizer_update_8bit_blockwise / optimizer_update_32bit: in place.
            if self.weight_decay != 0.0 {
                p.mul_scalar_(1.0 - self.lr * self.weight_decay)?;
            }
        }
        Ok(())
    }
}

/// AdamW as a training script writes it out in Python, the optimizer of the `lm` presets' run:
///
/// ```python
/// for p in params:
///     p.data -= lr * wd * p.data                                      # a product, then in place
///     m_old = state.get((p, "m"), torch.zeros_like(p))               # zeros made even when unused
///     v_old = state.get((p, "v"), torch.zeros_like(p))
///     m = beta1 * m_old + (1 - beta1) * p.grad                        # a new tensor every step
///     v = beta2 * v_old + (1 - beta2) * p.grad.pow(2)
///     p.data -= lr * m / (v.sqrt() + eps)
///     state[(p, "m")], state[(p, "v")] = m, v
/// ```
///
/// Each parameter of S bytes costs 14 allocations of S; the locals `m_old` and `v_old` keep
/// the previous state alive until the next parameter rebinds them, so while a parameter is
/// updated its old and new moments and three temporaries are live at once: the step's peak
/// is the largest parameter's 5 x S above parameters, gradients and state.
pub struct HandwrittenAdamW {
    params: Vec<Tensor>,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    state: Vec<Option<(Tensor, Tensor)>>,
}

impl HandwrittenAdamW {
    pub fn new(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> HandwrittenAdamW {
        let state = params.iter().map(|_| None).collect();
        HandwrittenAdamW { params, lr, betas: (0.9, 0.999), eps: 1e-8, weight_decay, state }
    }
}

impl Optimizer for HandwrittenAdamW {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn name(&self) -> &'static str {
        "AdamW"
    }

    fn update(&mut self) -> Result<()> {
        let _no_grad = autograd::no_grad();
        let (beta1, beta2) = self.betas;
        // The script's locals m_old and v_old: the previous parameter's old moments.
        let (mut m_old, mut v_old): (Option<Tensor>, Option<Tensor>) = (None, None);
        for (p, state) in self.params.iter().zip(self.state.iter_mut()) {
            let Some(g) = p.grad() else { continue };
            let device = p.device().clone();
            let decay = p.mul_scalar(self.lr * self.weight_decay)?;
            p.sub_(&decay)?;
            drop(decay);
            // `state.get(key, zeros_like(p))`: the zeros are made first, dropped if unused; the
            // rebinding then frees the previous parameter's old moment.
            let (mut m, mut v) = match state.take() {
                Some((m, v)) => (Some(m), Some(v)),
                None => (None, None),
            };
            for (old, kept) in [(&mut m_old, &mut m), (&mut v_old, &mut v)] {
                let zeros = in_state(&device, || device.zeros(p.shape(), p.dtype()))?;
                *old = Some(kept.take().unwrap_or(zeros));
            }
            let (m_prev, v_prev) = (m_old.as_ref().expect("bound above"), v_old.as_ref().expect("bound above"));
            let (decayed, fresh) = (m_prev.mul_scalar(beta1)?, g.mul_scalar(1.0 - beta1)?);
            let m = in_state(&device, || decayed.add(&fresh))?;
            drop((decayed, fresh));
            let (decayed, squared) = (v_prev.mul_scalar(beta2)?, g.pow_scalar(2.0)?);
            let fresh = squared.mul_scalar(1.0 - beta2)?;
            drop(squared);
            let v = in_state(&device, || decayed.add(&fresh))?;
            drop((decayed, fresh));
            // `p.data -= lr * m / (v.sqrt() + eps)`: Python frees the square root once eps is
            // added, the two operands of the division (left first) once it is done, and the
            // quotient after the subtraction.
            let step = m.mul_scalar(self.lr)?;
            let denominator = v.sqrt()?.add_scalar(self.eps)?;
            let update = step.div(&denominator)?;
            drop((step, denominator));
            p.sub_(&update)?;
            drop(update);
            *state = Some((m, v));
        }
        Ok(())
    }
}

/// Runs `f` with its allocations tagged as optimizer state.
fn in_state(device: &Device, f: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    let _state = device.category(Category::OptimizerState);
    f()
}

/// `torch.nn.utils.clip_grad_norm_(params, max_norm)` (foreach): each gradient's norm, their
/// norm, and every gradient scaled in place by min(1, max_norm / (total + 1e-6)). Returns the
/// total norm (a one-element tensor, as PyTorch's).
#[track_caller]
pub fn clip_grad_norm_(params: &[Tensor], max_norm: f64) -> Result<Tensor> {
    let _no_grad = autograd::no_grad();
    let grads: Vec<Tensor> = params.iter().filter_map(Tensor::grad).collect();
    if grads.is_empty() {
        return Err(TensorError::Shape("clip_grad_norm_: no parameter has a gradient".into()));
    }
    let norms = grads.iter().map(Tensor::norm).collect::<Result<Vec<_>>>()?;
    let total = Tensor::stack(&norms.iter().collect::<Vec<_>>(), 0)?.norm()?;
    // max_norm / (total + 1e-6) is Python's rtruediv: a reciprocal, then a product.
    let coefficient = total.add_scalar(1e-6)?.pow_scalar(-1.0)?.mul_scalar(max_norm)?.clamp_max(1.0)?;
    for g in &grads {
        g.mul_(&coefficient)?;
    }
    Ok(total)
}
