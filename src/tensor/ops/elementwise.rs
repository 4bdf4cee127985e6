//! Elementwise ops: unary, binary (broadcasting), ternary, fill; their in-place forms.

use super::{bind, check_u32, shape_meta, strided, values};
use crate::amp::{self, Policy};
use crate::autograd::{self, Save};
use crate::kernels::{ELEMENTWISE_WORKGROUP, ElementwiseMeta, Family, Grid, Kernel, loads_quads};
use crate::tensor::grad::not_differentiated_yet;
use crate::tensor::layout::{Layout, broadcast_shapes};
use crate::tensor::{DType, Result, Tensor, TensorError};

/// Quads (4 elements) a workgroup of the contiguous `quads` entry covers: four per invocation
/// (shaders/elementwise.wgsl).
const QUADS_PER_GROUP: u64 = 4 * ELEMENTWISE_WORKGROUP as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unary {
    Identity,
    /// Conversion to the output's dtype (`to(dtype)`).
    Cast,
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Relu,
    Gelu,
    Silu,
    Tanh,
    Sigmoid,
    Cos,
    Sin,
    /// The element's linear index (arange).
    Index,
    AddScalar,
    SubScalar,
    MulScalar,
    DivScalar,
    PowScalar,
    MaxScalar,
    MinScalar,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binary {
    Add,
    /// `add(other, alpha=s)`: x + s * y.
    AddScaled,
    /// `_add_relu`: relu(x + y), one kernel and one output.
    AddRelu,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// What a unary op's backward needs, as `derivatives.yaml` writes its derivative.
enum Saves {
    Nothing,
    Result,
    Input,
}

impl Unary {
    fn saves(self) -> Saves {
        match self {
            Unary::AddScalar | Unary::SubScalar | Unary::MulScalar | Unary::DivScalar | Unary::Neg | Unary::Cast => Saves::Nothing,
            Unary::Exp | Unary::Sqrt | Unary::Rsqrt | Unary::Relu | Unary::Tanh | Unary::Sigmoid => Saves::Result,
            _ => Saves::Input,
        }
    }

    /// Whether the in-place form is differentiated: its derivative must not need the input
    /// it overwrites.
    fn inplace_differentiated(self) -> bool {
        self.grad_fn().is_some() && !matches!(self.saves(), Saves::Input)
    }

    /// The autograd node's name, for the ops autograd differentiates.
    fn grad_fn(self) -> Option<&'static str> {
        Some(match self {
            Unary::AddScalar => "AddBackward1",
            Unary::SubScalar => "SubBackward1",
            Unary::MulScalar => "MulBackward1",
            Unary::DivScalar => "DivBackward1",
            Unary::Neg => "NegBackward0",
            Unary::Exp => "ExpBackward0",
            Unary::Log => "LogBackward0",
            Unary::Sqrt => "SqrtBackward0",
            Unary::Rsqrt => "RsqrtBackward0",
            Unary::Abs => "AbsBackward0",
            Unary::Relu => "ReluBackward0",
            Unary::Gelu => "GeluBackward0",
            Unary::Silu => "SiluBackward0",
            Unary::Tanh => "TanhBackward0",
            Unary::Sigmoid => "SigmoidBackward0",
            Unary::PowScalar => "PowBackward0",
            Unary::MaxScalar => "ClampMinBackward0",
            Unary::MinScalar => "ClampMaxBackward0",
            Unary::Cast => "ToCopyBackward0",
            Unary::Identity | Unary::Index | Unary::Cos | Unary::Sin => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Unary::Identity => "copy",
            Unary::Cast => "to",
            Unary::Neg => "neg",
            Unary::Abs => "abs",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Relu => "relu",
            Unary::Gelu => "gelu",
            Unary::Silu => "silu",
            Unary::Tanh => "tanh",
            Unary::Sigmoid => "sigmoid",
            Unary::Cos => "cos",
            Unary::Sin => "sin",
            Unary::Index => "arange",
            Unary::AddScalar => "add",
            Unary::SubScalar => "sub",
            Unary::MulScalar => "mul",
            Unary::DivScalar => "div",
            Unary::PowScalar => "pow",
            Unary::MaxScalar => "clamp_min",
            Unary::MinScalar => "clamp_max",
        }
    }

    /// The WGSL expression from x (element of value type `t`), s (scalar) and i (linear index),
    /// giving a value of type `out` (which differs from `t` only for Cast).
    fn expr(self, dtype: DType, t: &str, out: &str, out_dtype: DType) -> Result<String> {
        let float = dtype.is_float();
        // Transcendentals compute in f32 (f16 has too little range for exp in the middle of gelu).
        let f = |e: &str| if t == "f32" { e.replace('X', "x") } else { format!("{t}({})", e.replace('X', "f32(x)")) };
        Ok(match self {
            Unary::Identity => "x".into(),
            Unary::Cast if out_dtype == DType::Bool => format!("select(0u, 1u, x != {t}(0))"),
            // WGSL's float-to-int conversion truncates toward zero, as PyTorch's does.
            Unary::Cast => format!("{out}(x)"),
            Unary::Neg if dtype != DType::U32 => "-x".into(),
            Unary::Abs => "abs(x)".into(),
            Unary::Relu => format!("max(x, {t}(0))"),
            Unary::Index => format!("{t}(i)"),
            Unary::AddScalar => "x + s".into(),
            Unary::SubScalar => "x - s".into(),
            Unary::MulScalar => "x * s".into(),
            Unary::DivScalar => "x / s".into(),
            Unary::MaxScalar => "max(x, s)".into(),
            Unary::MinScalar => "min(x, s)".into(),
            Unary::Exp if float => f("exp(X)"),
            Unary::Log if float => f("log(X)"),
            Unary::Sqrt if float => f("sqrt(X)"),
            Unary::Rsqrt if float => f("inverseSqrt(X)"),
            Unary::Tanh if float => f("tanh(X)"),
            Unary::Cos if float => f("cos(X)"),
            Unary::Sin if float => f("sin(X)"),
            Unary::Sigmoid if float => f("1.0 / (1.0 + exp(-X))"),
            Unary::Silu if float => f("X / (1.0 + exp(-X))"),
            Unary::Gelu if float => f("0.5 * X * (1.0 + erf_approx(X * 0.7071067811865476))"),
            Unary::PowScalar if float => f("pow_signed(X, f32(s))"),
            other => return Err(TensorError::DType(format!("{} is not defined for {dtype} tensors", other.name()))),
        })
    }
}

impl Binary {
    /// The autograd node's name, for the ops autograd differentiates.
    fn grad_fn(self) -> Option<&'static str> {
        Some(match self {
            Binary::Add | Binary::AddScaled => "AddBackward0",
            Binary::Sub => "SubBackward0",
            Binary::Mul => "MulBackward0",
            Binary::Div => "DivBackward0",
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Binary::Add | Binary::AddScaled => "add",
            Binary::AddRelu => "_add_relu",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Pow => "pow",
            Binary::Maximum => "maximum",
            Binary::Minimum => "minimum",
            Binary::Eq => "eq",
            Binary::Ne => "ne",
            Binary::Lt => "lt",
            Binary::Le => "le",
            Binary::Gt => "gt",
            Binary::Ge => "ge",
        }
    }

    /// Comparisons give bool tensors (one byte per element, as in PyTorch).
    fn out_dtype(self, input: DType) -> DType {
        match self {
            Binary::Eq | Binary::Ne | Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge => DType::Bool,
            _ => input,
        }
    }

    fn expr(self, dtype: DType, t: &str) -> Result<String> {
        let compare = |op: &str| format!("select(0u, 1u, x {op} y)");
        Ok(match self {
            Binary::Add => "x + y".into(),
            Binary::AddScaled => format!("x + {t}(s) * y"),
            Binary::AddRelu => format!("max(x + y, {t}(0))"),
            Binary::Sub => "x - y".into(),
            Binary::Mul => "x * y".into(),
            Binary::Div => "x / y".into(),
            Binary::Maximum => "max(x, y)".into(),
            Binary::Minimum => "min(x, y)".into(),
            Binary::Eq => compare("=="),
            Binary::Ne => compare("!="),
            Binary::Lt => compare("<"),
            Binary::Le => compare("<="),
            Binary::Gt => compare(">"),
            Binary::Ge => compare(">="),
            Binary::Pow if dtype.is_float() => format!("{t}(pow_signed(f32(x), f32(y)))"),
            Binary::Pow => return Err(TensorError::DType(format!("pow is not defined for {dtype} tensors"))),
        })
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

/// How the scalar `s` is read, for value type `t`.
fn scalar_expr(t: &str) -> &'static str {
    match t {
        "f32" => "bitcast<f32>(scalar_bits)",
        "f16" => "f16(bitcast<f32>(scalar_bits))",
        "i32" => "bitcast<i32>(scalar_bits)",
        _ => "scalar_bits",
    }
}

fn scalar_bits(value: f64, t: &str) -> u32 {
    match t {
        "f32" | "f16" => (value as f32).to_bits(),
        "i32" => (value as i32) as u32,
        _ => value as u32,
    }
}

/// Which elementwise entry, with its expression (the others get a trivial one: every entry
/// compiles with the module).
pub(super) enum Entry {
    Unary(String),
    Binary(String),
    /// A binary expression over operands of different types, both converted to the given
    /// value type first (PyTorch's type promotion).
    Promoted(String, &'static str),
    Ternary(String),
    Fill,
    /// Random numbers from `expr` (using `uniform(i, lane)` / `normal(i)`) and a seed.
    Random(String, u32),
    /// The gradient scaler's unscale and inf/NaN check.
    Unscale,
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
        let names = ["out", "a", "b", "c"];
        let spec: Vec<(&str, DType)> = names.iter().zip(&operands).map(|(&n, t)| (n, t.dtype)).collect();
        let (mut seed, mut promote) = (0, "");
        let (entry_name, expr) = match entry {
            Entry::Unary(e) => ("unary", e),
            Entry::Binary(e) => ("binary", e),
            Entry::Promoted(e, t) => {
                promote = t;
                ("binary", e)
            }
            Entry::Ternary(e) => ("ternary", e),
            Entry::Fill => ("fill", "s".to_string()),
            Entry::Random(e, s) => {
                seed = s;
                ("fill", e)
            }
            Entry::Unscale => ("unscale", String::new()),
        };
        // The scalar is of the type the expression computes in: the first input's, or the
        // promoted type of mixed operands.
        let scalar_type = if promote.is_empty() { values(operands[if inputs.is_empty() { 0 } else { 1 }].dtype, &device)? } else { promote };
        let pick = |name: &str, trivial: &str| if name == entry_name { expr.clone() } else { trivial.to_string() };
        let out_t = values(self.dtype, &device)?;
        // When every operand is contiguous in the same shape, index them as flat arrays: the
        // kernel then skips the per-dimension index arithmetic; f32 (and native f16) operands
        // that each start at a multiple of 4 elements go four at a time.
        let flat = self.is_contiguous() && layouts.iter().all(|l| l.is_contiguous());
        let offsets = std::iter::once(self.layout.offset).chain(layouts.iter().map(|l| l.offset)).chain(std::iter::repeat(self.layout.offset));
        let quads = flat
            && matches!(entry_name, "unary" | "binary" | "ternary" | "fill")
            && operands.iter().all(|t| loads_quads(t.dtype, device.native_f16()))
            && offsets.take(4).enumerate().all(|(slot, offset)| (b.plan.base(slot) as usize + offset).is_multiple_of(4));
        // The contiguous form is one entry, `quads`, specialised by the op family it runs.
        let (quad_family, entry_name, vec4): (&str, &str, &[&'static str]) = if quads { (entry_name, "quads", &names) } else { ("fill", entry_name, &[]) };
        let kernel = Kernel::new(Family::Elementwise, entry_name)
            .with_meta::<ElementwiseMeta>()
            .with_operands_vec4(device.native_f16(), &b.plan, &spec, vec4)?
            .with("SCALAR", scalar_expr(scalar_type))
            .with("UNARY", pick("unary", &format!("{out_t}(x)")))
            .with("BINARY", pick("binary", &format!("{out_t}(x)")))
            .with("PROMOTE", promote)
            .with("TERNARY", pick("ternary", &format!("{out_t}(x)")))
            .with("FILL", pick("fill", &format!("{out_t}(s)")))
            .with("QUADS", quad_family);
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
            scalar: scalar_bits(scalar, scalar_type),
            seed,
            limit: 0,
        };
        let threads = if quads { (self.numel() as u64).div_ceil(QUADS_PER_GROUP * 4) * ELEMENTWISE_WORKGROUP as u64 } else { self.numel() as u64 };
        Ok(device.launch(&kernel, &meta, &b, Grid::Threads { threads, workgroup: ELEMENTWISE_WORKGROUP })?)
    }

    /// Writes `op(src)` into `self`'s elements (shapes must agree; src may broadcast).
    pub(crate) fn unary_into(&self, src: &Tensor, op: Unary, scalar: f64) -> Result<()> {
        if src.dtype != self.dtype && op != Unary::Cast {
            return Err(TensorError::DType(format!("{} of a {} tensor into a {} tensor", op.name(), src.dtype, self.dtype)));
        }
        let device = self.device().clone();
        let (t, out) = (values(src.dtype, &device)?, values(self.dtype, &device)?);
        let expr = op.expr(src.dtype, t, out, self.dtype)?;
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
        let mut expr = op.expr(compute, t)?;
        let out_t = values(self.dtype, self.device())?;
        if result != DType::Bool && out_t != t {
            expr = format!("{out_t}({expr})");
        }
        let entry = if a.dtype == b.dtype { Entry::Binary(expr) } else { Entry::Promoted(expr, t) };
        self.elementwise(entry, &[a, b], scalar)
    }

    #[track_caller]
    fn unary(&self, op: Unary, scalar: f64) -> Result<Tensor> {
        // exp, log, rsqrt and pow are on autocast's float32 list.
        if matches!(op, Unary::Exp | Unary::Log | Unary::Rsqrt | Unary::PowScalar)
            && let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[self])?
        {
            return cast[0].unary(op, scalar);
        }
        let t = values(self.dtype, self.device())?;
        op.expr(self.dtype, t, t, self.dtype)?;
        if op.grad_fn().is_none() {
            not_differentiated_yet(op.name(), &[self])?;
        }
        let out = self.device().empty_tensor(self.shape(), self.dtype, op.name())?;
        out.unary_into(self, op, scalar)?;
        Ok(self.record_unary(op, scalar, out))
    }

    /// Records a unary op for autograd, saving what `derivatives.yaml` saves: nothing for the
    /// scalar arithmetic, neg and casts; the result where the derivative is written with it
    /// (exp, sqrt, rsqrt, relu, tanh, sigmoid); the input otherwise.
    #[track_caller]
    fn record_unary(&self, op: Unary, scalar: f64, out: Tensor) -> Tensor {
        if !autograd::records(&[self]) {
            return out;
        }
        let Some(name) = op.grad_fn() else { return out };
        let save = match op.saves() {
            Saves::Nothing => None,
            Saves::Result => Some(Save::Output),
            Saves::Input => Some(Save::Input(self)),
        };
        let input_dtype = self.dtype;
        autograd::record(
            name,
            &[self],
            out,
            &[save],
            Box::new(move |saved, g| {
                let s = || saved[0].as_ref().expect("saved");
                Ok(vec![Some(match op {
                    Unary::AddScalar | Unary::SubScalar => g.share(),
                    Unary::MulScalar => g.mul_scalar(scalar)?,
                    Unary::DivScalar => g.div_scalar(scalar)?,
                    Unary::Neg => g.neg()?,
                    Unary::Cast => g.to(input_dtype)?,
                    Unary::Exp => g.mul(s())?,
                    Unary::Log => g.div(s())?,
                    // grad / (2 * result), as PyTorch writes it (one temporary).
                    Unary::Sqrt => g.div(&s().mul_scalar(2.0)?)?,
                    // -0.5 * grad * result^3: PyTorch's two temporaries, then the product.
                    Unary::Rsqrt => g.mul_scalar(-0.5)?.mul(&s().pow_scalar(3.0)?)?,
                    // grad * exponent * self^(exponent - 1), as PyTorch's pow_backward.
                    Unary::PowScalar if scalar == 0.0 => g.device().zeros(g.shape(), g.dtype)?,
                    Unary::PowScalar => g.mul(&s().pow_scalar(scalar - 1.0)?.mul_scalar(scalar)?)?,
                    // The fused backward kernels (threshold_backward, tanh_backward, ...): one output.
                    _ => g.fused_backward(op, s(), scalar)?,
                })])
            }),
        )
    }

    /// A unary op's fused backward kernel (`threshold_backward(grad, result, 0)`,
    /// `tanh_backward(grad, result)`, `gelu_backward(grad, self)`, ...): one output, from the
    /// gradient (x) and what the op saved (y).
    #[track_caller]
    fn fused_backward(&self, op: Unary, saved: &Tensor, scalar: f64) -> Result<Tensor> {
        let (name, derivative) = match op {
            Unary::Relu => ("threshold_backward", "select(0.0, X, Y > 0.0)"),
            Unary::Tanh => ("tanh_backward", "X * (1.0 - Y * Y)"),
            Unary::Sigmoid => ("sigmoid_backward", "X * (1.0 - Y) * Y"),
            // d/dy [y * Phi(y)] = Phi(y) + y * phi(y).
            Unary::Gelu => ("gelu_backward", "X * (0.5 * (1.0 + erf_approx(Y * 0.7071067811865476)) + Y * 0.3989422804014327 * exp(-0.5 * Y * Y))"),
            // d/dy [y * sigmoid(y)] = sigmoid(y) * (1 + y * (1 - sigmoid(y))).
            Unary::Silu => ("silu_backward", "X / (1.0 + exp(-Y)) * (1.0 + Y * (1.0 - 1.0 / (1.0 + exp(-Y))))"),
            Unary::Abs => ("abs_backward", "X * sign(Y)"),
            Unary::MaxScalar => ("clamp_min_backward", "select(0.0, X, Y >= S)"),
            Unary::MinScalar => ("clamp_max_backward", "select(0.0, X, Y <= S)"),
            _ => unreachable!("{op:?} has no fused backward"),
        };
        let out = self.device().empty_tensor(self.shape(), self.dtype, name)?;
        let t = values(self.dtype, self.device())?;
        // In f32 whatever the dtype: X the gradient, Y the saved tensor, S the scalar.
        let expr = format!("{t}({})", derivative.replace('X', "f32(x)").replace('Y', "f32(y)").replace('S', "bitcast<f32>(scalar_bits)"));
        out.elementwise(Entry::Binary(expr), &[self, saved], scalar)?;
        Ok(out)
    }

    #[track_caller]
    fn binary(&self, other: &Tensor, op: Binary) -> Result<Tensor> {
        self.binary_with(other, op, 0.0)
    }

    #[track_caller]
    fn binary_with(&self, other: &Tensor, op: Binary, scalar: f64) -> Result<Tensor> {
        if op == Binary::Pow
            && let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::Fp32, &[self, other])?
        {
            return cast[0].binary_with(&cast[1], op, scalar);
        }
        let shape = broadcast_shapes(self.shape(), other.shape())?;
        let compute = result_type(op.name(), self, other)?;
        op.expr(compute, values(compute, self.device())?)?;
        if op.grad_fn().is_none() && op.out_dtype(compute) == compute {
            not_differentiated_yet(op.name(), &[self, other])?;
        }
        let out = self.device().empty_tensor(&shape, op.out_dtype(compute), op.name())?;
        out.binary_into(self, other, op, scalar)?;
        Ok(self.record_binary(other, op, scalar, out))
    }

    /// Records add, sub, mul or div for autograd. Each input's gradient is summed back to its
    /// own shape where it was broadcast. mul saves the other operand of each input that needs a
    /// gradient; div saves the divisor, and the dividend too when the divisor needs a gradient.
    #[track_caller]
    fn record_binary(&self, other: &Tensor, op: Binary, alpha: f64, out: Tensor) -> Tensor {
        if !autograd::records(&[self, other]) {
            return out;
        }
        let Some(name) = op.grad_fn() else { return out };
        let (a_shape, b_shape) = (self.shape().to_vec(), other.shape().to_vec());
        let need = [self.requires_grad(), other.requires_grad()];
        // mul keeps [b if a needs a gradient, a if b does]; div [b, a if b needs a gradient].
        let save = match op {
            Binary::Mul => [need[0].then_some(Save::Input(other)), need[1].then_some(Save::Input(self))],
            Binary::Div => [Some(Save::Input(other)), need[1].then_some(Save::Input(self))],
            _ => [None, None],
        };
        autograd::record(
            name,
            &[self, other],
            out,
            &save,
            Box::new(move |saved, g| {
                let slot = |i: usize| saved[i].as_ref().expect("saved for this gradient");
                let (ga, gb) = match op {
                    Binary::Add => (need[0].then(|| g.share()), need[1].then(|| g.share())),
                    // As `maybe_multiply(grad, alpha)`: alpha 1 passes the gradient itself.
                    Binary::AddScaled => {
                        let gb = match need[1] {
                            true if alpha == 1.0 => Some(g.share()),
                            true => Some(g.mul_scalar(alpha)?),
                            false => None,
                        };
                        (need[0].then(|| g.share()), gb)
                    }
                    Binary::Sub => (need[0].then(|| g.share()), if need[1] { Some(g.neg()?) } else { None }),
                    Binary::Mul => (if need[0] { Some(g.mul(slot(0))?) } else { None }, if need[1] { Some(g.mul(slot(1))?) } else { None }),
                    _ => {
                        let b = slot(0);
                        let ga = if need[0] { Some(g.div(b)?) } else { None };
                        // d(a / b)/db = -a / b^2 = -(g * a / b) / b.
                        let gb = if need[1] { Some(g.mul(slot(1))?.div(b)?.div(b)?.neg()?) } else { None };
                        (ga, gb)
                    }
                };
                Ok(vec![ga.map(|g| g.sum_to(&a_shape)).transpose()?, gb.map(|g| g.sum_to(&b_shape)).transpose()?])
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
        let differentiated = matches!(op, Binary::Add | Binary::Sub);
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

    /// `torch._amp_foreach_non_finite_check_and_unscale_` for one float32 gradient: multiplies
    /// it by `inv_scale` in place and sets `found_inf` to 1 if it holds an inf or a NaN (both
    /// 0-d float32). Allocates nothing.
    pub(crate) fn unscale_and_check_(&self, inv_scale: &Tensor, found_inf: &Tensor) -> Result<()> {
        for t in [self, inv_scale, found_inf] {
            if t.dtype != DType::F32 {
                return Err(TensorError::DType(format!("unscaling needs float32 gradients and scales, got {}", t.dtype)));
            }
        }
        if inv_scale.numel() != 1 || found_inf.numel() != 1 {
            return Err(TensorError::Shape("found_inf and inv_scale must be 1-element tensors".into()));
        }
        self.elementwise(Entry::Unscale, &[self, inv_scale, found_inf], 0.0)?;
        self.bump_version();
        found_inf.bump_version();
        Ok(())
    }

    /// `fill_`: every element becomes `value`; allocates nothing.
    pub fn fill_(&self, value: f64) -> Result<&Tensor> {
        values(self.dtype, self.device()).or_else(|e| if self.device().is_sim() { Ok("") } else { Err(e) })?;
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
        let out = self.device().empty_tensor(self.shape(), dtype, "to")?;
        out.unary_into(self, Unary::Cast, 0.0)?;
        if !dtype.is_float() {
            // An integer result is outside the graph, as in PyTorch.
            return Ok(out);
        }
        Ok(self.record_unary(Unary::Cast, 0.0, out))
    }

    /// `torch.where(self, a, b)`: `self` is a bool condition; all three broadcast.
    #[track_caller]
    pub fn where_(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if self.dtype != DType::Bool {
            return Err(TensorError::DType(format!("where needs a bool condition, got {}", self.dtype)));
        }
        if a.dtype != b.dtype {
            return Err(TensorError::DType(format!("where of {} and {}", a.dtype, b.dtype)));
        }
        let shape = broadcast_shapes(&broadcast_shapes(self.shape(), a.shape())?, b.shape())?;
        let out = self.device().empty_tensor(&shape, a.dtype, "where")?;
        out.elementwise(Entry::Ternary("select(z, y, x != 0u)".into()), &[self, a, b], 0.0)?;
        if !autograd::records(&[a, b]) {
            return Ok(out);
        }
        // WhereBackward0 saves the condition; each side's gradient is where(condition, grad, 0)
        // (or the other way round), summed back to its shape.
        let (a_shape, b_shape) = (a.shape().to_vec(), b.shape().to_vec());
        let need = [a.requires_grad(), b.requires_grad()];
        Ok(autograd::record(
            "WhereBackward0",
            &[a, b],
            out,
            &[Some(Save::Input(self))],
            Box::new(move |saved, g| {
                let cond = saved[0].as_ref().expect("saved");
                let side = |kept_where: bool, shape: &[usize]| g.kept_where(cond, kept_where, "where")?.sum_to(shape);
                Ok(vec![need[0].then(|| side(true, &a_shape)).transpose()?, need[1].then(|| side(false, &b_shape)).transpose()?])
            }),
        ))
    }

    /// `masked_fill(mask, value)`: self where the bool `mask` (broadcast) is false, `value`
    /// where it is true; one output. `MaskedFillBackward0` saves the mask.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        if mask.dtype != DType::Bool {
            return Err(TensorError::DType(format!("masked_fill only supports boolean masks, but got mask with dtype {}", mask.dtype)));
        }
        let shape = broadcast_shapes(self.shape(), mask.shape())?;
        if shape != self.shape() {
            return Err(TensorError::Shape(format!("masked_fill: mask {:?} does not broadcast to {:?}", mask.shape(), self.shape())));
        }
        let t = values(self.dtype, self.device())?;
        let out = self.device().empty_tensor(self.shape(), self.dtype, "masked_fill")?;
        // -inf and NaN pass as bits: a WGSL constant cannot be infinite.
        out.elementwise(Entry::Binary(format!("select(x, {t}(bitcast<f32>(scalar_bits)), y != 0u)")), &[self, mask], value)?;
        if !autograd::records(&[self]) {
            return Ok(out);
        }
        Ok(autograd::record(
            "MaskedFillBackward0",
            &[self],
            out,
            &[Some(Save::Input(mask))],
            Box::new(move |saved, g| Ok(vec![Some(g.kept_where(saved[0].as_ref().expect("saved"), false, "masked_fill")?)])),
        ))
    }

    /// Self (a gradient) where the bool `mask` is `kept_where`, zero elsewhere: the backward of
    /// where (`where(cond, grad, 0)` and `where(cond, 0, grad)`) and of masked_fill
    /// (`grad.masked_fill(mask, 0)`). One output.
    #[track_caller]
    fn kept_where(&self, mask: &Tensor, kept_where: bool, op: &'static str) -> Result<Tensor> {
        let t = values(self.dtype, self.device())?;
        let out = self.device().empty_tensor(self.shape(), self.dtype, op)?;
        let test = if kept_where { "!=" } else { "==" };
        out.elementwise(Entry::Binary(format!("select({t}(0), x, y {test} 0u)")), &[self, mask], 0.0)?;
        Ok(out)
    }

    /// An in-place ternary update `self = expr(self, y, z, s)` (optimizer steps), which no
    /// graph tracks.
    fn update_(&self, op: &str, expr: &str, y: &Tensor, z: &Tensor, value: f64) -> Result<&Tensor> {
        if y.dtype != self.dtype || z.dtype != self.dtype || !self.dtype.is_float() {
            return Err(TensorError::DType(format!("{op} of {}, {} and {}", self.dtype, y.dtype, z.dtype)));
        }
        self.check_inplace(op, &[y, z], false)?;
        self.elementwise(Entry::Ternary(expr.into()), &[self, y, z], value)?;
        self.bump_version();
        Ok(self)
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

    /// `add_(other, alpha=value)`: self += value * other, in place, with no temporary.
    pub fn add_scaled_(&self, other: &Tensor, value: f64) -> Result<&Tensor> {
        self.update_("add_", "x + s * y", other, other, value)
    }

    /// `lerp_(end, weight)`: self += weight * (end - self), in place (Adam's first moment).
    pub fn lerp_(&self, end: &Tensor, weight: f64) -> Result<&Tensor> {
        self.update_("lerp_", "x + s * (y - x)", end, end, weight)
    }

    /// `addcdiv_(t1, t2, value)`: self += value * t1 / t2, in place.
    pub fn addcdiv_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        self.update_("addcdiv_", "x + s * y / z", t1, t2, value)
    }

    /// `addcmul_(t1, t2, value)`: self += value * t1 * t2, in place.
    pub fn addcmul_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        self.update_("addcmul_", "x + s * y * z", t1, t2, value)
    }
}

macro_rules! compare_ops {
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

compare_ops! {
    eq => Binary::Eq;
    ne => Binary::Ne;
    lt => Binary::Lt;
    le => Binary::Le;
    gt => Binary::Gt;
    ge => Binary::Ge;
}

macro_rules! binary_ops {
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

binary_ops! {
    add, add_, add_scalar, add_scalar_ => Binary::Add, Unary::AddScalar;
    sub, sub_, sub_scalar, sub_scalar_ => Binary::Sub, Unary::SubScalar;
    mul, mul_, mul_scalar, mul_scalar_ => Binary::Mul, Unary::MulScalar;
    div, div_, div_scalar, div_scalar_ => Binary::Div, Unary::DivScalar;
    pow, pow_, pow_scalar, pow_scalar_ => Binary::Pow, Unary::PowScalar;
    maximum, maximum_, clamp_min, clamp_min_ => Binary::Maximum, Unary::MaxScalar;
    minimum, minimum_, clamp_max, clamp_max_ => Binary::Minimum, Unary::MinScalar;
}

macro_rules! unary_ops {
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

unary_ops! {
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
