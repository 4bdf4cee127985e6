//! `torch.amp.GradScaler`: multiplies the loss by a scale so that small f16 gradients do not
//! flush to zero, then divides the gradients back before the optimizer steps, skipping the
//! step when a gradient overflowed. Its memory is PyTorch's: the scale (float32) and growth
//! tracker (int32) as 0-d tensors made at the first `scale`, the scaled loss, and per step the
//! inverse scale and `found_inf` (0-d each); gradients are unscaled in place.

use super::Optimizer;
use crate::autograd;
use crate::tensor::{DType, Result, Tensor, TensorError};
use rustc_hash::FxHashMap;

/// Where an optimizer is in the iteration (PyTorch's `OptState`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Ready,
    Unscaled,
    Stepped,
}

struct OptimizerState {
    stage: Stage,
    /// 1 if a gradient held an inf or a NaN; lives until `update`.
    found_inf: Option<Tensor>,
    /// found_inf's value once `step` read it (a sync with the device), so `update` does not
    /// read it again.
    overflowed: Option<bool>,
}

/// Reads found_inf: a sync with the device, as PyTorch's `.item()`. The sim device has no
/// values: it overflows only where the types alone decide it (`known`, see
/// [`GradScaler::scale`]).
async fn read_overflow(found_inf: &Tensor, known: bool) -> Result<bool> {
    if found_inf.device().is_sim() || known {
        // (On a GPU too: WGSL leaves a float16 conversion out of range undefined, so the
        // kernels need not have made the inf PyTorch's would.)
        return Ok(known);
    }
    Ok(found_inf.item::<f32>().await? != 0.0)
}

/// The smallest value float16 rounds to infinity (half-way between its largest, 65,504, and
/// the 65,536 it cannot hold).
const F16_ROUNDS_TO_INF: f64 = 65520.0;

pub struct GradScaler {
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u32,
    init_scale: f64,
    scale: Option<Tensor>,
    growth_tracker: Option<Tensor>,
    /// The scale and tracker's values, kept on the host as well: the sim device has no data,
    /// and WGSL has no float64 for PyTorch's `_scale.double().reciprocal()`.
    scale_value: f64,
    tracker_value: u32,
    /// By optimizer (its address), as PyTorch keys them by `id(optimizer)`: an optimizer must
    /// stay in place from `unscale_`/`step` to `update`.
    states: FxHashMap<usize, OptimizerState>,
    /// This iteration scaled a float16 output by a scale float16 cannot hold (see `scale`).
    scaled_past_f16: bool,
}

impl Default for GradScaler {
    fn default() -> GradScaler {
        GradScaler::new()
    }
}

fn key(optimizer: &dyn Optimizer) -> usize {
    optimizer as *const dyn Optimizer as *const () as usize
}

impl GradScaler {
    /// PyTorch's defaults: scale 2^16, doubled after 2000 steps without an overflow, halved
    /// at each overflow.
    pub fn new() -> GradScaler {
        GradScaler::with_init_scale(65536.0)
    }

    pub fn with_init_scale(init_scale: f64) -> GradScaler {
        GradScaler {
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            init_scale,
            scale: None,
            growth_tracker: None,
            scale_value: init_scale,
            tracker_value: 0,
            states: FxHashMap::default(),
            scaled_past_f16: false,
        }
    }

    /// The current scale (`get_scale()`).
    pub fn get_scale(&self) -> f64 {
        self.scale_value
    }

    /// `scaler.scale(loss)`: the loss times the scale (a recorded `mul`), the scale and the
    /// growth tracker made at the first call. A float16 loss (one computed outside autocast
    /// from float16 logits) times the float32 scale is float32, but backward casts its
    /// gradient back to float16: the scale itself, which float16 cannot hold at the default
    /// 65,536. Every gradient is then inf, so the step is skipped and the scale halved, as on
    /// a real GPU, whatever the values.
    #[track_caller]
    pub fn scale(&mut self, outputs: &Tensor) -> Result<Tensor> {
        if outputs.dtype() == DType::F16 && outputs.requires_grad() && self.scale_value >= F16_ROUNDS_TO_INF {
            self.scaled_past_f16 = true;
        }
        let scale = match &self.scale {
            Some(scale) => scale.share(),
            None => {
                let device = outputs.device();
                let scale = device.full(&[], self.init_scale, DType::F32)?;
                self.growth_tracker = Some(device.full(&[], 0.0, DType::I32)?);
                self.scale = Some(scale.share());
                scale
            }
        };
        outputs.mul(&scale)
    }

    fn state(&mut self, optimizer: &dyn Optimizer) -> &mut OptimizerState {
        self.states.entry(key(optimizer)).or_insert(OptimizerState { stage: Stage::Ready, found_inf: None, overflowed: None })
    }

    /// `scaler.unscale_(optimizer)`: divides the optimizer's gradients by the scale in place
    /// (for clipping before the step) and records whether any overflowed.
    #[track_caller]
    pub fn unscale_(&mut self, optimizer: &dyn Optimizer) -> Result<()> {
        let Some(scale) = self.scale.as_ref().map(Tensor::share) else {
            return Err(TensorError::Unsupported(
                "Attempted unscale_ but _scale is None.  This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
                    .into(),
            ));
        };
        match self.state(optimizer).stage {
            Stage::Unscaled => return Err(TensorError::Unsupported("unscale_() has already been called on this optimizer since the last update().".into())),
            Stage::Stepped => return Err(TensorError::Unsupported("unscale_() is being called after step().".into())),
            Stage::Ready => {}
        }
        let device = scale.device().clone();
        // `inv_scale = self._scale.double().reciprocal().float()`: two float64 temporaries, the
        // first freed when the second exists. Their value is computed on the host.
        let inv_scale = {
            let double = device.empty_tensor(&[], DType::F64, "to")?;
            let reciprocal = device.empty_tensor(&[], DType::F64, "reciprocal")?;
            drop(double);
            let inv_scale = device.empty_tensor(&[], DType::F32, "to")?;
            inv_scale.fill_((1.0 / self.scale_value) as f32 as f64)?;
            drop(reciprocal);
            inv_scale
        };
        let found_inf = device.full(&[], 0.0, DType::F32)?;
        let grads: Vec<Tensor> = optimizer.params().iter().filter_map(Tensor::grad).collect();
        if grads.iter().any(|g| g.dtype() == DType::F16) {
            return Err(TensorError::DType("Attempting to unscale FP16 gradients.".into()));
        }
        // `_unscale_grads_` hands the kernel per-device copies (`_MultiDeviceReplicator.get`:
        // `to(device, copy=True)`), found_inf's first; the copy of found_inf is what lives until
        // `update`, the originals go when `unscale_` returns. No gradients, no copies.
        let found_copy = if grads.is_empty() {
            None
        } else {
            let _no_grad = autograd::no_grad();
            let found_copy = device.empty_tensor(&[], DType::F32, "to")?;
            found_copy.copy_(&found_inf)?;
            let inv_copy = device.empty_tensor(&[], DType::F32, "to")?;
            inv_copy.copy_(&inv_scale)?;
            for grad in &grads {
                grad.unscale_and_check_(&inv_copy, &found_copy)?;
            }
            Some(found_copy)
        };
        drop((inv_scale, found_inf));
        *self.state(optimizer) = OptimizerState { stage: Stage::Unscaled, found_inf: found_copy, overflowed: None };
        Ok(())
    }

    /// `scaler.step(optimizer)`: unscales (unless `unscale_` did), then steps the optimizer
    /// unless a gradient overflowed. Returns whether it stepped. Reading `found_inf` syncs
    /// with the device, as PyTorch's `.item()` does; the sim device has no values and steps.
    pub async fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        if self.scale.is_none() {
            return Err(TensorError::Unsupported(
                "Attempted step but _scale is None.  This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.".into(),
            ));
        }
        if self.state(optimizer).stage == Stage::Stepped {
            return Err(TensorError::Unsupported("step() has already been called since the last update().".into()));
        }
        if self.state(optimizer).stage == Stage::Ready {
            self.unscale_(optimizer)?;
        }
        let Some(found_inf) = self.state(optimizer).found_inf.as_ref().map(Tensor::share) else {
            return Err(TensorError::Unsupported("No inf checks were recorded for this optimizer.".into()));
        };
        let overflowed = read_overflow(&found_inf, self.scaled_past_f16).await?;
        if !overflowed {
            optimizer.step()?;
        }
        let state = self.state(optimizer);
        state.stage = Stage::Stepped;
        state.overflowed = Some(overflowed);
        Ok(!overflowed)
    }

    /// `scaler.update()`: halves the scale after an overflow, doubles it after
    /// `growth_interval` clean steps (`_amp_update_scale_`, in place), and frees this
    /// iteration's `found_inf`.
    pub async fn update(&mut self) -> Result<()> {
        let (Some(scale), Some(tracker)) = (&self.scale, &self.growth_tracker) else {
            return Err(TensorError::Unsupported(
                "Attempted update but _scale is None.  This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
                    .into(),
            ));
        };
        let found: Vec<(Tensor, Option<bool>)> = self.states.values().filter_map(|s| s.found_inf.as_ref().map(|f| (f.share(), s.overflowed))).collect();
        if found.is_empty() {
            return Err(TensorError::Unsupported("No inf checks were recorded prior to update.".into()));
        }
        let mut overflowed = false;
        for (found_inf, read) in &found {
            overflowed |= match read {
                Some(read) => *read,
                None => read_overflow(found_inf, self.scaled_past_f16).await?,
            };
        }
        if overflowed {
            self.scale_value *= self.backoff_factor;
            self.tracker_value = 0;
        } else {
            self.tracker_value += 1;
            if self.tracker_value == self.growth_interval {
                // Grown only while the float32 scale stays finite, as `_amp_update_scale_`.
                if ((self.scale_value * self.growth_factor) as f32).is_finite() {
                    self.scale_value *= self.growth_factor;
                }
                self.tracker_value = 0;
            }
        }
        scale.fill_(self.scale_value)?;
        tracker.fill_(self.tracker_value as f64)?;
        drop(found);
        self.states.clear();
        self.scaled_past_f16 = false;
        Ok(())
    }
}
