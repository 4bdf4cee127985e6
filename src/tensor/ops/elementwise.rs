//! Elementwise ops: unary, binary (broadcasting), fill, copy and casts; their in-place forms
//! and their autograd records. Each op is declared once, in `kernels::elementwise` (its name,
//! dtypes, autocast list, WGSL and backward rule); this runs them and carries out the backward
//! rules. The fused ones (where, masked_fill, the optimizers' updates) are in `fused`.

use super::{bind, check_u32, shape_meta, strided, values};
use crate::kernels::elementwise::{Autocast, Binary, BinaryBackward, ElementwiseKernel, Entry, Saves, Unary, UnaryBackward, fused_backward};
use crate::kernels::{ElementwiseMeta, loads_quads};
use crate::tensor::autocast::{self as amp, Policy};
use crate::tensor::grad::not_differentiated_yet;
use crate::tensor::graph::{self, Save};
use crate::tensor::layout::{Layout, broadcast_shapes};
use crate::tensor::{DType, Result, Tensor, TensorError};

/// The error for an op not defined for a dtype.
fn undefined(name: &str, dtype: DType) -> TensorError {
    TensorError::DType(format!("{name} is not defined for {dtype} tensors"))
}

impl Unary {
    /// Whether the in-place form is differentiated: its derivative must not need the input
    /// it overwrites.
    fn inplace_differentiated(self) -> bool {
        self.decl().grad.is_some_and(|g| g.saves != Saves::Input)
    }
}

impl Binary {
    /// Whether the in-place form is differentiated (add_, sub_): its backward must not need
    /// the input it overwrites.
    fn inplace_differentiated(self) -> bool {
        self.decl().grad.is_some_and(|g| !g.backward.saves_inputs())
    }
}

/// PyTorch's `result_type` for two tensor operands: the promoted type of those with dimensions;
/// a 0-d tensor (a loss, a gradient scale) counts only when it is of a higher kind, so an f16
/// tensor times an f32 0-d tensor stays f16.
pub(crate) fn result_type(op: &str, a: &Tensor, b: &Tensor) -> Result<DType> {
    let promote = |x: DType, y: DType| {
        x.promote(y).ok_or_else(|| TensorError::DType(format!("{op} of {x} and {y}: no common type (PyTorch refuses uint32 with another integer type; int8 with uint8 needs int16, which tensormem does not have)")))
    };
    match (a.ndim() == 0, b.ndim() == 0) {
        (false, true) | (true, false) => {
            let (dim, zero) = if a.ndim() > 0 { (a.dtype, b.dtype) } else { (b.dtype, a.dtype) };
            if zero.kind() > dim.kind() { promote(dim, zero) } else { Ok(dim) }
        }
        _ => promote(a.dtype, b.dtype),
    }
}

impl Tensor {
    /// Runs one elementwise kernel writing `self`'s elements from up to three inputs broadcast
    /// to `self`'s shape. `scalar` is read with the first input's value type (self's for fill).
    pub(super) fn elementwise(&self, entry: Entry, inputs: &[&Tensor], scalar: f64) -> Result<()> {
        for t in inputs {
            self.same_device(t)?;
        }
        let layouts = inputs.iter().map(|t| t.layout.expand(self.shape())).collect::<Result<Vec<_>>>()?;
        if !self.launches(inputs, 0) {
            return Ok(());
        }
        let device = self.device().clone();
        check_u32(self)?;
        for t in inputs {
            check_u32(t)?;
        }
        // Unused operand slots repeat the output, so every accessor the module declares exists.
        let mut operands: Vec<&Tensor> = vec![self];
        operands.extend(inputs);
        while operands.len() < 4 {
            operands.push(self);
        }
        let b = bind(&operands)?;
        // When every operand is contiguous in the same shape, index them as flat arrays: the
        // kernel then skips the per-dimension index arithmetic; f32 (and native f16) operands
        // that each start at a multiple of 4 elements go four at a time.
        let flat = self.is_contiguous() && layouts.iter().all(|l| l.is_contiguous());
        let offsets = std::iter::once(self.layout.offset).chain(layouts.iter().map(|l| l.offset)).chain(std::iter::repeat(self.layout.offset));
        let quads = flat
            && entry.has_quads()
            && operands.iter().all(|t| loads_quads(t.dtype, device.native_f16()))
            && offsets.take(4).enumerate().all(|(slot, offset)| (b.plan.base(slot) as usize + offset).is_multiple_of(4));
        let dtypes = [0, 1, 2, 3].map(|i| operands[i].dtype);
        let k = ElementwiseKernel::new(entry, dtypes, inputs.len(), scalar, device.native_f16(), &b.plan, quads)?;
        let as_flat = |l: &Layout| Layout { shape: vec![l.numel()], strides: vec![1], offset: l.offset };
        let (out_layout, layouts) = if flat { (as_flat(&self.layout), layouts.iter().map(as_flat).collect()) } else { (self.layout.clone(), layouts) };
        let operand = |slot: usize| match layouts.get(slot) {
            Some(l) => strided(l, b.plan.base(slot + 1)),
            None => strided(&out_layout, b.plan.base(0)),
        };
        let meta = ElementwiseMeta {
            numel: self.numel() as u32,
            ndim: out_layout.ndim() as u32,
            shape: shape_meta(&out_layout.shape),
            out: strided(&out_layout, b.plan.base(0)),
            a: operand(0),
            b: operand(1),
            c: operand(2),
            scalar: k.scalar_bits,
            seed: k.seed,
            limit: 0,
        };
        Ok(device.launch(&k.kernel, &meta, &b, ElementwiseKernel::grid(self.numel(), quads))?)
    }

    /// Writes `op(src)` into `self`'s elements (shapes must agree; src may broadcast).
    pub(crate) fn unary_into(&self, src: &Tensor, op: Unary, scalar: f64) -> Result<()> {
        if src.dtype != self.dtype && op != Unary::Cast {
            return Err(TensorError::DType(format!("{} of a {} tensor into a {} tensor", op.name(), src.dtype, self.dtype)));
        }
        let device = self.device().clone();
        let (t, out) = (values(src.dtype, &device)?, values(self.dtype, &device)?);
        let expr = op.wgsl(src.dtype, t, out, self.dtype).ok_or_else(|| undefined(op.name(), src.dtype))?;
        self.elementwise(Entry::Unary(expr), &[src], scalar)
    }

    /// Writes `op(a, b)` into self, computed in the operands' promoted type and converted to
    /// self's (an in-place op may write a wider result into a narrower float, as PyTorch's).
    /// `op` of `a` and `b` into self; `scalar` is the `s` of ops that take one (alpha).
    fn binary_into(&self, a: &Tensor, b: &Tensor, op: Binary, scalar: f64) -> Result<()> {
        let compute = result_type(op.name(), a, b)?;
        let result = op.out_dtype(compute);
        if result != self.dtype && !(result == compute && compute.can_cast(self.dtype)) {
            return Err(TensorError::DType(format!("result type {result} of {} can't be cast to the desired output type {}", op.name(), self.dtype)));
        }
        let t = values(compute, self.device())?;
        let mut expr = op.wgsl(compute, t).ok_or_else(|| undefined(op.name(), compute))?;
        let out_t = values(self.dtype, self.device())?;
        if result != DType::Bool && out_t != t {
            expr = out_t.cast(&expr);
        }
        let entry = if a.dtype == b.dtype { Entry::Binary(expr) } else { Entry::Promoted(expr, t) };
        self.elementwise(entry, &[a, b], scalar)
    }

    #[track_caller]
    fn unary(&self, op: Unary, scalar: f64) -> Result<Tensor> {
        // Ops on autocast's float32 list (exp, log, rsqrt, pow) cast their inputs first.
        if op.decl().autocast == Autocast::Fp32
            && let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[self])?
        {
            return cast[0].unary(op, scalar);
        }
        let t = values(self.dtype, self.device())?;
        op.wgsl(self.dtype, t, t, self.dtype).ok_or_else(|| undefined(op.name(), self.dtype))?;
        if op.decl().grad.is_none() {
            not_differentiated_yet(op.name(), &[self])?;
        }
        let out = self.device().empty_result(self.shape(), &[self], self.dtype, op.name())?;
        out.unary_into(self, op, scalar)?;
        Ok(self.record_unary(op, scalar, out))
    }

    /// Records a unary op for autograd, saving what `derivatives.yaml` saves: nothing for the
    /// scalar arithmetic, neg and casts; the result where the derivative is written with it
    /// (exp, sqrt, rsqrt, relu, tanh, sigmoid); the input otherwise.
    #[track_caller]
    fn record_unary(&self, op: Unary, scalar: f64, out: Tensor) -> Tensor {
        if !graph::records(&[self]) {
            return out;
        }
        let Some(grad) = op.decl().grad else { return out };
        let save = match grad.saves {
            Saves::Nothing => None,
            Saves::Output => Some(Save::Output),
            Saves::Input => Some(Save::Input(self)),
        };
        let input_dtype = self.dtype;
        graph::record(
            grad.node,
            &[self],
            out,
            &[save],
            Box::new(move |saved, g| {
                let s = || saved[0].as_ref().expect("saved");
                Ok(vec![Some(match grad.backward {
                    UnaryBackward::Grad => g.share(),
                    UnaryBackward::MulScalar => g.mul_scalar(scalar)?,
                    UnaryBackward::DivScalar => g.div_scalar(scalar)?,
                    UnaryBackward::Neg => g.neg()?,
                    UnaryBackward::CastBack => g.to(input_dtype)?,
                    UnaryBackward::MulSaved => g.mul(s())?,
                    UnaryBackward::DivSaved => g.div(s())?,
                    UnaryBackward::Sqrt => g.div(&s().mul_scalar(2.0)?)?,
                    UnaryBackward::Rsqrt => g.mul_scalar(-0.5)?.mul(&s().pow_scalar(3.0)?)?,
                    UnaryBackward::PowScalar if scalar == 0.0 => g.device().zeros(g.shape(), g.dtype)?,
                    UnaryBackward::PowScalar => g.mul(&s().pow_scalar(scalar - 1.0)?.mul_scalar(scalar)?)?,
                    UnaryBackward::Fused(name, derivative) => g.fused_backward(name, derivative, s(), scalar)?,
                })])
            }),
        )
    }

    /// A unary op's fused backward kernel (`threshold_backward(grad, result, 0)`,
    /// `tanh_backward(grad, result)`, `gelu_backward(grad, self)`, ...): one output, from the
    /// gradient (x) and what the op saved (y).
    #[track_caller]
    fn fused_backward(&self, name: &'static str, derivative: fn(&str, &str, &str) -> String, saved: &Tensor, scalar: f64) -> Result<Tensor> {
        let out = self.device().empty_result(self.shape(), &[self, saved], self.dtype, name)?;
        let t = values(self.dtype, self.device())?;
        out.elementwise(Entry::Binary(fused_backward(t, derivative)), &[self, saved], scalar)?;
        Ok(out)
    }

    #[track_caller]
    fn binary(&self, other: &Tensor, op: Binary) -> Result<Tensor> {
        self.binary_with(other, op, 0.0)
    }

    #[track_caller]
    fn binary_with(&self, other: &Tensor, op: Binary, scalar: f64) -> Result<Tensor> {
        if op.decl().autocast == Autocast::Fp32
            && let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[self, other])?
        {
            return cast[0].binary_with(&cast[1], op, scalar);
        }
        let shape = broadcast_shapes(self.shape(), other.shape())?;
        let compute = result_type(op.name(), self, other)?;
        op.wgsl(compute, values(compute, self.device())?).ok_or_else(|| undefined(op.name(), compute))?;
        if op.decl().grad.is_none() && op.out_dtype(compute) == compute {
            not_differentiated_yet(op.name(), &[self, other])?;
        }
        let out = self.device().empty_result(&shape, &[self, other], op.out_dtype(compute), op.name())?;
        out.binary_into(self, other, op, scalar)?;
        Ok(self.record_binary(other, op, scalar, out))
    }

    /// Records add, sub, mul or div for autograd. Each input's gradient is summed back to its
    /// own shape where it was broadcast. mul saves the other operand of each input that needs a
    /// gradient; div saves the divisor, and the dividend too when the divisor needs a gradient.
    #[track_caller]
    fn record_binary(&self, other: &Tensor, op: Binary, alpha: f64, out: Tensor) -> Tensor {
        if !graph::records(&[self, other]) {
            return out;
        }
        let Some(grad) = op.decl().grad else { return out };
        let need = [self.requires_grad(), other.requires_grad()];
        // mul keeps [b if a needs a gradient, a if b does]; div [b, a if b needs a gradient].
        let save = match grad.backward {
            BinaryBackward::Mul => [need[0].then_some(Save::Input(other)), need[1].then_some(Save::Input(self))],
            BinaryBackward::Div => [Some(Save::Input(other)), need[1].then_some(Save::Input(self))],
            _ => [None, None],
        };
        graph::record(
            grad.node,
            &[self, other],
            out,
            &save,
            Box::new(move |saved, g| {
                let slot = |i: usize| saved[i].as_ref().expect("saved for this gradient");
                let (ga, gb) = match grad.backward {
                    BinaryBackward::Add => (need[0].then(|| g.share()), need[1].then(|| g.share())),
                    // As `maybe_multiply(grad, alpha)`: alpha 1 passes the gradient itself.
                    BinaryBackward::AddScaled => {
                        let gb = match need[1] {
                            true if alpha == 1.0 => Some(g.share()),
                            true => Some(g.mul_scalar(alpha)?),
                            false => None,
                        };
                        (need[0].then(|| g.share()), gb)
                    }
                    BinaryBackward::Sub => (need[0].then(|| g.share()), if need[1] { Some(g.neg()?) } else { None }),
                    // PyTorch's generated nodes compute their inputs' gradients in the
                    // alphabetical order of the arguments' names: `other` before `self`.
                    BinaryBackward::Mul => {
                        let gb = if need[1] { Some(g.mul(slot(1))?) } else { None };
                        (if need[0] { Some(g.mul(slot(0))?) } else { None }, gb)
                    }
                    BinaryBackward::Div => {
                        let b = slot(0);
                        // d(a / b)/db = -a / b^2 = -(g * a / b) / b.
                        let gb = if need[1] { Some(g.mul(slot(1))?.div(b)?.div(b)?.neg()?) } else { None };
                        (if need[0] { Some(g.div(b)?) } else { None }, gb)
                    }
                };
                // The engine sums each back to its input's shape (validate_outputs).
                Ok(vec![ga, gb])
            }),
        )
    }

    /// An in-place binary op. add_ and sub_ on tensors the graph tracks record themselves: self
    /// gets the new node, whose edge leads to its previous history.
    #[track_caller]
    fn binary_inplace(&self, other: &Tensor, op: Binary) -> Result<&Tensor> {
        let shape = broadcast_shapes(self.shape(), other.shape())?;
        if shape != self.shape() {
            return Err(TensorError::Shape(format!(
                "in-place {} cannot change the shape {:?} (the other operand broadcasts to {shape:?})",
                op.name(),
                self.shape()
            )));
        }
        let differentiated = op.inplace_differentiated();
        self.check_inplace(op.name(), &[other], differentiated)?;
        self.binary_into(self, other, op, 0.0)?;
        self.bump_version();
        if differentiated {
            self.record_binary(other, op, 0.0, self.share());
        }
        Ok(self)
    }

    /// An in-place unary op (or one with a Python number); recorded as the out-of-place op is
    /// when its derivative does not need the overwritten input.
    #[track_caller]
    fn unary_inplace(&self, op: Unary, scalar: f64) -> Result<&Tensor> {
        self.check_inplace(op.name(), &[], op.inplace_differentiated())?;
        self.unary_into(self, op, scalar)?;
        self.bump_version();
        if op.inplace_differentiated() {
            self.record_unary(op, scalar, self.share());
        }
        Ok(self)
    }

    /// `fill_`: every element becomes `value`; allocates nothing.
    pub fn fill_(&self, value: f64) -> Result<&Tensor> {
        // The sim device fills any dtype (it writes nothing); a GPU only those kernels take.
        if let Err(e) = values(self.dtype, self.device())
            && !self.device().is_sim()
        {
            return Err(e);
        }
        self.check_inplace("fill_", &[], false)?;
        self.elementwise(Entry::Fill, &[], value)?;
        self.bump_version();
        Ok(self)
    }

    pub fn zero_(&self) -> Result<&Tensor> {
        self.fill_(0.0)
    }

    /// `copy_`: writes `src` (broadcast to self's shape, converted to self's dtype) into self.
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        self.check_inplace("copy_", &[src], false)?;
        self.unary_into(src, if src.dtype == self.dtype { Unary::Identity } else { Unary::Cast }, 0.0)?;
        self.bump_version();
        Ok(self)
    }

    /// `to(dtype)`: a converted copy (self when the dtype already matches, as in PyTorch).
    #[track_caller]
    pub fn to(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.share());
        }
        // `memory_format=torch.preserve_format`: the layout of self, made dense.
        let out = self.device().empty_result(self.shape(), &[self], dtype, "to")?;
        out.unary_into(self, Unary::Cast, 0.0)?;
        if !dtype.is_float() {
            // An integer result is outside the graph, as in PyTorch.
            return Ok(out);
        }
        Ok(self.record_unary(Unary::Cast, 0.0, out))
    }

    /// `torch.add(self, other, alpha=alpha)`: self + alpha * other, broadcasting, in one kernel
    /// and one output (scale and add without a temporary for the scaled operand).
    #[track_caller]
    pub fn add_alpha(&self, other: &Tensor, alpha: f64) -> Result<Tensor> {
        if !result_type("add", self, other)?.is_float() && alpha.fract() != 0.0 {
            return Err(TensorError::DType(format!("for integral input tensors, argument alpha must not be a floating point number (alpha = {alpha})")));
        }
        self.binary_with(other, Binary::AddScaled, alpha)
    }

    /// `torch._VF._add_relu(self, other)`: relu(self + other) in one kernel and one output, where
    /// `add` then `relu` allocate two (the first freed at once). PyTorch does not differentiate
    /// it, and neither does tensormem.
    #[track_caller]
    pub fn add_relu(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::AddRelu)
    }

    /// `_add_relu_`: in place, nothing allocated.
    #[track_caller]
    pub fn add_relu_(&self, other: &Tensor) -> Result<&Tensor> {
        self.binary_inplace(other, Binary::AddRelu)
    }
}

macro_rules! compare_methods {
    ($($name:ident => $op:expr;)*) => {
        impl Tensor {
            $(
                /// Elementwise comparison (broadcasting): a bool tensor.
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(other, $op)
                }
            )*
        }
    };
}

compare_methods! {
    eq => Binary::Eq;
    ne => Binary::Ne;
    lt => Binary::Lt;
    le => Binary::Le;
    gt => Binary::Gt;
    ge => Binary::Ge;
}

macro_rules! binary_methods {
    ($($name:ident, $inplace:ident, $scalar:ident, $scalar_inplace:ident => $op:expr, $sop:expr;)*) => {
        impl Tensor {
            $(
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(other, $op)
                }

                #[track_caller]
                pub fn $inplace(&self, other: &Tensor) -> Result<&Tensor> {
                    self.binary_inplace(other, $op)
                }

                /// In place, with a Python number.
                #[track_caller]
                pub fn $scalar_inplace(&self, value: f64) -> Result<&Tensor> {
                    self.unary_inplace($sop, value)
                }

                /// With a Python number: no device memory for the scalar, as in PyTorch.
                #[track_caller]
                pub fn $scalar(&self, value: f64) -> Result<Tensor> {
                    self.unary($sop, value)
                }
            )*
        }
    };
}

binary_methods! {
    add, add_, add_scalar, add_scalar_ => Binary::Add, Unary::AddScalar;
    sub, sub_, sub_scalar, sub_scalar_ => Binary::Sub, Unary::SubScalar;
    mul, mul_, mul_scalar, mul_scalar_ => Binary::Mul, Unary::MulScalar;
    div, div_, div_scalar, div_scalar_ => Binary::Div, Unary::DivScalar;
    pow, pow_, pow_scalar, pow_scalar_ => Binary::Pow, Unary::PowScalar;
    maximum, maximum_, clamp_min, clamp_min_ => Binary::Maximum, Unary::MaxScalar;
    minimum, minimum_, clamp_max, clamp_max_ => Binary::Minimum, Unary::MinScalar;
}

macro_rules! unary_methods {
    ($($name:ident, $inplace:ident => $op:expr;)*) => {
        impl Tensor {
            $(
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary($op, 0.0)
                }

                #[track_caller]
                pub fn $inplace(&self) -> Result<&Tensor> {
                    self.unary_inplace($op, 0.0)
                }
            )*
        }
    };
}

unary_methods! {
    neg, neg_ => Unary::Neg;
    abs, abs_ => Unary::Abs;
    exp, exp_ => Unary::Exp;
    log, log_ => Unary::Log;
    sqrt, sqrt_ => Unary::Sqrt;
    rsqrt, rsqrt_ => Unary::Rsqrt;
    relu, relu_ => Unary::Relu;
    gelu, gelu_ => Unary::Gelu;
    silu, silu_ => Unary::Silu;
    tanh, tanh_ => Unary::Tanh;
    sigmoid, sigmoid_ => Unary::Sigmoid;
    cos, cos_ => Unary::Cos;
    sin, sin_ => Unary::Sin;
}
