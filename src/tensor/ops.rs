//! Ops with PyTorch's names and broadcasting. Each reads strided inputs directly; each output is
//! one allocation; in-place ops allocate nothing. On the simulation device the same allocations
//! happen and the kernels are skipped.

use super::layout::{Layout, MAX_DIMS, broadcast_shapes, wrap_dim};
use super::{DType, Result, Tensor, TensorError};
use crate::kernels::{self, Bindings, ELEMENTWISE_WORKGROUP, Family, Kernel, WORKGROUP, value_type};

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

/// Reductions of at least this many elements per output run a workgroup per output.
const WIDE_REDUCTION: usize = 2048;

/// A reduction's name and its kernel's ACC, INIT, STEP and FINISH substitutions.
type ReductionSpec = (&'static str, (String, String, String, String));

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduction {
    Sum,
    Mean,
    Max,
    Min,
}

/// The value type of `dtype` in kernels (f32 stands in for f16 when checking before a device
/// is involved); errors name the dtypes that run on the GPU.
fn values(dtype: DType, device: &crate::device::Device) -> Result<&'static str> {
    let native = device.adapter().is_none_or(|a| a.native_f16);
    Ok(value_type(dtype, native)?)
}

impl Unary {
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
            Unary::Sigmoid if float => f("1.0 / (1.0 + exp(-X))"),
            Unary::Silu if float => f("X / (1.0 + exp(-X))"),
            Unary::Gelu if float => f("0.5 * X * (1.0 + erf_approx(X * 0.7071067811865476))"),
            Unary::PowScalar if float => f("pow_signed(X, f32(s))"),
            other => return Err(TensorError::DType(format!("{} is not defined for {dtype} tensors", other.name()))),
        })
    }
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
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

/// How the scalar `s` is read, for value type `t`.
fn scalar_expr(t: &str) -> &'static str {
    match t {
        "f32" => "bitcast<f32>(info[SCALAR_AT])",
        "f16" => "f16(bitcast<f32>(info[SCALAR_AT]))",
        "i32" => "bitcast<i32>(info[SCALAR_AT])",
        _ => "info[SCALAR_AT]",
    }
}

fn scalar_bits(value: f64, t: &str) -> u32 {
    match t {
        "f32" | "f16" => (value as f32).to_bits(),
        "i32" => (value as i32) as u32,
        _ => value as u32,
    }
}

/// Binds the operands (in order) for one dispatch.
fn bind(tensors: &[&Tensor]) -> Result<Bindings> {
    let args = tensors
        .iter()
        .map(|t| t.arg()?.ok_or_else(|| TensorError::Unsupported("an empty tensor cannot be a kernel operand".into())))
        .collect::<Result<Vec<_>>>()?;
    Ok(Bindings::new(&args, &tensors.iter().map(|t| t.dtype.size() as u64).collect::<Vec<_>>())?)
}

/// `[offset, strides..]` padded to MAX_DIMS; `base` is where the operand starts in its binding.
fn push_layout(meta: &mut Vec<u32>, l: &Layout, base: u32) {
    meta.push(base + l.offset as u32);
    for d in 0..MAX_DIMS {
        meta.push(l.strides.get(d).copied().unwrap_or(0) as u32);
    }
}

fn push_shape(meta: &mut Vec<u32>, shape: &[usize]) {
    for d in 0..MAX_DIMS {
        meta.push(shape.get(d).copied().unwrap_or(1) as u32);
    }
}

fn check_u32(t: &Tensor) -> Result<()> {
    if t.layout.storage_span() > u32::MAX as usize {
        return Err(TensorError::Unsupported(format!("tensor of {} elements: kernels index with 32 bits", t.layout.storage_span())));
    }
    Ok(())
}

/// Which elementwise entry, with its expression (the others get a trivial one: every entry
/// compiles with the module).
enum Entry {
    Unary(String),
    Binary(String),
    Ternary(String),
    Fill,
    /// Random numbers from `expr` (using `uniform(i, lane)` / `normal(i)`) and a seed.
    Random(String, u32),
}

impl Tensor {
    fn same_device(&self, other: &Tensor) -> Result<()> {
        if self.device() != other.device() {
            return Err(TensorError::Unsupported("tensors are on different devices".into()));
        }
        Ok(())
    }

    /// Whether the op writing `self` from `inputs` launches a kernel: on a GPU, when there is
    /// anything to write. The sim device launches nothing; it charges its modelled clock by the
    /// bytes the op moves (`self` written, each input read once) and by `flops`. Only matmul
    /// passes FLOPs: the other ops do a few per element, far below any card's FLOP-per-byte
    /// balance (20 for f32 on an H100), so their bytes bound them.
    pub(super) fn launches(&self, inputs: &[&Tensor], flops: u64) -> bool {
        let device = self.device();
        if !device.is_sim() {
            return self.numel() > 0;
        }
        // In u64: on wasm32 a usize product wraps at 4 GiB, and the sim device's tensors go far beyond.
        let bytes = std::iter::once(self).chain(inputs.iter().copied()).map(|t| t.numel() as u64 * t.dtype.size() as u64).sum();
        device.model_op(bytes, flops, matches!(self.dtype, DType::F16 | DType::BF16));
        false
    }

    /// Runs one elementwise kernel writing `self`'s elements from up to three inputs broadcast
    /// to `self`'s shape. `scalar` is read with the first input's value type (self's for fill).
    fn elementwise(&self, entry: Entry, inputs: &[&Tensor], scalar: f64) -> Result<()> {
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
        let scalar_type = values(operands[if inputs.is_empty() { 0 } else { 1 }].dtype, &device)?;
        let mut seed = 0;
        let (entry_name, expr) = match entry {
            Entry::Unary(e) => ("unary", e),
            Entry::Binary(e) => ("binary", e),
            Entry::Ternary(e) => ("ternary", e),
            Entry::Fill => ("fill", "s".to_string()),
            Entry::Random(e, s) => {
                seed = s;
                ("fill", e)
            }
        };
        let pick = |name: &str, trivial: &str| if name == entry_name { expr.clone() } else { trivial.to_string() };
        let out_t = values(self.dtype, &device)?;
        let kernel = Kernel::new(Family::Elementwise, entry_name)
            .with_operands(&device, &b, &spec)?
            .with("SCALAR", scalar_expr(scalar_type))
            .with("UNARY", pick("unary", &format!("{out_t}(x)")))
            .with("BINARY", pick("binary", &format!("{out_t}(x)")))
            .with("TERNARY", pick("ternary", &format!("{out_t}(x)")))
            .with("FILL", pick("fill", &format!("{out_t}(s)")));
        // When every operand is contiguous in the same shape, index them as flat arrays: the
        // kernel then skips the per-dimension index arithmetic.
        let flat = self.is_contiguous() && layouts.iter().all(|l| l.is_contiguous());
        let as_flat = |l: &Layout| Layout { shape: vec![l.numel()], strides: vec![1], offset: l.offset };
        let (out_layout, layouts) = if flat { (as_flat(&self.layout), layouts.iter().map(as_flat).collect()) } else { (self.layout.clone(), layouts) };
        let mut meta = vec![self.numel() as u32, out_layout.ndim() as u32];
        push_shape(&mut meta, &out_layout.shape);
        push_layout(&mut meta, &out_layout, b.base(0));
        for slot in 0..3 {
            match layouts.get(slot) {
                Some(l) => push_layout(&mut meta, l, b.base(slot + 1)),
                None => push_layout(&mut meta, &out_layout, b.base(0)),
            }
        }
        meta.push(scalar_bits(scalar, scalar_type));
        meta.push(seed);
        Ok(kernels::dispatch(&device, &kernel, &meta, &b, self.numel() as u64, ELEMENTWISE_WORKGROUP)?)
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

    fn binary_into(&self, a: &Tensor, b: &Tensor, op: Binary) -> Result<()> {
        if a.dtype != b.dtype || op.out_dtype(a.dtype) != self.dtype {
            return Err(TensorError::DType(format!("{} of {} and {}: convert one with to(dtype) first", op.name(), a.dtype, b.dtype)));
        }
        let expr = op.expr(a.dtype, values(a.dtype, self.device())?)?;
        self.elementwise(Entry::Binary(expr), &[a, b], 0.0)
    }

    #[track_caller]
    fn unary(&self, op: Unary, scalar: f64) -> Result<Tensor> {
        let t = values(self.dtype, self.device())?;
        op.expr(self.dtype, t, t, self.dtype)?;
        let out = self.device().empty_tensor(self.shape(), self.dtype, op.name())?;
        out.unary_into(self, op, scalar)?;
        Ok(out)
    }

    #[track_caller]
    fn binary(&self, other: &Tensor, op: Binary) -> Result<Tensor> {
        let shape = broadcast_shapes(self.shape(), other.shape())?;
        if self.dtype != other.dtype {
            return Err(TensorError::DType(format!("{} of {} and {}: convert one with to(dtype) first", op.name(), self.dtype, other.dtype)));
        }
        op.expr(self.dtype, values(self.dtype, self.device())?)?;
        let out = self.device().empty_tensor(&shape, op.out_dtype(self.dtype), op.name())?;
        out.binary_into(self, other, op)?;
        Ok(out)
    }

    fn binary_inplace(&self, other: &Tensor, op: Binary) -> Result<&Tensor> {
        let shape = broadcast_shapes(self.shape(), other.shape())?;
        if shape != self.shape() {
            return Err(TensorError::Shape(format!(
                "in-place {} cannot change the shape {:?} (the other operand broadcasts to {shape:?})",
                op.name(),
                self.shape()
            )));
        }
        self.binary_into(self, other, op)?;
        Ok(self)
    }

    fn unary_inplace(&self, op: Unary, scalar: f64) -> Result<&Tensor> {
        self.unary_into(self, op, scalar)?;
        Ok(self)
    }

    /// `fill_`: every element becomes `value`; allocates nothing.
    pub fn fill_(&self, value: f64) -> Result<&Tensor> {
        values(self.dtype, self.device()).or_else(|e| if self.device().is_sim() { Ok("") } else { Err(e) })?;
        self.elementwise(Entry::Fill, &[], value)?;
        Ok(self)
    }

    pub fn zero_(&self) -> Result<&Tensor> {
        self.fill_(0.0)
    }

    /// `copy_`: writes `src` (broadcast to self's shape, converted to self's dtype) into self.
    pub fn copy_(&self, src: &Tensor) -> Result<&Tensor> {
        self.unary_into(src, if src.dtype == self.dtype { Unary::Identity } else { Unary::Cast }, 0.0)?;
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
        Ok(out)
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
        Ok(out)
    }

    /// `addcmul_(t1, t2, value)`: self += value * t1 * t2, in place.
    pub fn addcmul_(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Result<&Tensor> {
        if t1.dtype != self.dtype || t2.dtype != self.dtype {
            return Err(TensorError::DType(format!("addcmul_ of {}, {} and {}", self.dtype, t1.dtype, t2.dtype)));
        }
        if !self.dtype.is_float() {
            return Err(TensorError::DType(format!("addcmul_ of {} tensors", self.dtype)));
        }
        self.elementwise(Entry::Ternary("x + s * y * z".into()), &[self, t1, t2], value)?;
        Ok(self)
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
    ($($name:ident, $inplace:ident, $scalar:ident => $op:expr, $sop:expr;)*) => {
        impl Tensor {
            $(
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(other, $op)
                }

                pub fn $inplace(&self, other: &Tensor) -> Result<&Tensor> {
                    self.binary_inplace(other, $op)
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
    add, add_, add_scalar => Binary::Add, Unary::AddScalar;
    sub, sub_, sub_scalar => Binary::Sub, Unary::SubScalar;
    mul, mul_, mul_scalar => Binary::Mul, Unary::MulScalar;
    div, div_, div_scalar => Binary::Div, Unary::DivScalar;
    pow, pow_, pow_scalar => Binary::Pow, Unary::PowScalar;
    maximum, maximum_, clamp_min => Binary::Maximum, Unary::MaxScalar;
    minimum, minimum_, clamp_max => Binary::Minimum, Unary::MinScalar;
}

macro_rules! unary_ops {
    ($($name:ident, $inplace:ident => $op:expr;)*) => {
        impl Tensor {
            $(
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary($op, 0.0)
                }

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
}

impl Tensor {
    /// Reduces `dims` (all of them when empty) into one new tensor, as ATen does: one kernel,
    /// one output allocation, however many dimensions.
    #[track_caller]
    fn reduce(&self, dims: &[isize], keepdim: bool, op: Reduction) -> Result<Tensor> {
        let mut dims: Vec<usize> =
            if dims.is_empty() { (0..self.ndim()).collect() } else { dims.iter().map(|&d| wrap_dim(d, self.ndim())).collect::<Result<_>>()? };
        dims.sort_unstable();
        dims.dedup();
        if self.ndim() == 0 {
            return self.clone();
        }
        let (name, (acc, init, step, finish)) = self.reduction_spec(op)?;
        let mut out_shape = self.shape().to_vec();
        for &d in &dims {
            out_shape[d] = 1;
        }
        let n: usize = dims.iter().map(|&d| self.shape()[d]).product();
        let out = self.device().empty_tensor(&out_shape, self.dtype, name)?;
        let device = self.device().clone();
        if n == 0 && out.numel() > 0 {
            // Reducing nothing: the identity (PyTorch: sum 0, mean NaN; max and min raise).
            match op {
                Reduction::Sum => out.fill_(0.0)?,
                Reduction::Mean => out.fill_(f64::NAN)?,
                _ => return Err(TensorError::Shape(format!("{name} over an empty dimension has no identity"))),
            };
        } else if out.launches(&[self], 0) {
            check_u32(self)?;
            let b = bind(&[&out, self])?;
            let finish = finish.replace("{T}", values(self.dtype, &device)?);
            // Long reductions get a workgroup each (see shaders/reduce.wgsl).
            let wide = n >= WIDE_REDUCTION;
            let kernel = Kernel::new(Family::Reduce, if wide { "reduce_wide" } else { "reduce" })
                .with_operands(&device, &b, &[("out", self.dtype), ("a", self.dtype)])?
                .with("ACC", acc)
                .with("INIT", init)
                .with("STEP", step)
                .with("FINISH", finish);
            let mut meta = vec![out.numel() as u32, self.ndim() as u32];
            push_shape(&mut meta, &out_shape);
            push_layout(&mut meta, &out.layout, b.base(0));
            push_layout(&mut meta, &self.layout, b.base(1));
            // The reduced dimensions' sizes and input strides, innermost last.
            meta.extend([dims.len() as u32, n as u32]);
            for i in 0..MAX_DIMS {
                meta.push(dims.get(i).map_or(1, |&d| self.shape()[d] as u32));
            }
            for i in 0..MAX_DIMS {
                meta.push(dims.get(i).map_or(0, |&d| self.strides()[d] as u32));
            }
            if wide {
                kernels::dispatch(&device, &kernel, &meta, &b, out.numel() as u64 * 256, 256)?;
            } else {
                kernels::dispatch(&device, &kernel, &meta, &b, out.numel() as u64, WORKGROUP)?;
            }
        }
        if keepdim {
            return Ok(out);
        }
        let shape: Vec<usize> = (0..self.ndim()).filter(|d| !dims.contains(d)).map(|d| self.shape()[d]).collect();
        Ok(out.view_with(Layout { shape: shape.clone(), strides: Layout::contiguous(&shape).strides, offset: out.layout.offset }))
    }

    fn reduction_spec(&self, op: Reduction) -> Result<ReductionSpec> {
        let t = values(self.dtype, self.device())?;
        let float = self.dtype.is_float();
        // Floats accumulate in f32 (f16 sums lose too much otherwise); integers in their type.
        let acc = if float { "f32" } else { t };
        let cast = |e: &str| format!("{acc}({e})");
        let (lowest, highest) = match self.dtype {
            DType::I32 => ("-2147483647 - 1", "2147483647"),
            DType::U32 => ("0u", "4294967295u"),
            // ±FLT_MAX by bits: a decimal literal may round past f32's range (Tint rejects it).
            _ => ("bitcast<f32>(0xff7fffffu)", "bitcast<f32>(0x7f7fffffu)"),
        };
        Ok(match op {
            Reduction::Sum => ("sum", (acc.into(), cast("0"), format!("acc = acc + {};", cast("x")), "{T}(acc)".into())),
            Reduction::Mean if float => ("mean", (acc.into(), cast("0"), format!("acc = acc + {};", cast("x")), "{T}(acc / f32(n))".into())),
            Reduction::Mean => return Err(TensorError::DType(format!("mean of {} tensors: PyTorch requires a floating dtype", self.dtype))),
            Reduction::Max => ("max", (acc.into(), cast(lowest), format!("acc = max(acc, {});", cast("x")), "{T}(acc)".into())),
            Reduction::Min => ("min", (acc.into(), cast(highest), format!("acc = min(acc, {});", cast("x")), "{T}(acc)".into())),
        })
    }

    /// `sum(dims, keepdim)`; empty `dims` reduces everything.
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, Reduction::Sum)
    }

    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, Reduction::Mean)
    }

    /// `amax(dims, keepdim)`: maximum values.
    #[track_caller]
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, Reduction::Max)
    }

    #[track_caller]
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, Reduction::Min)
    }

    /// `matmul` with PyTorch's rules (ATen's `_matmul_impl`): 1-D operands gain and lose a
    /// dimension, a stack of matrices times a matrix folds into one product, and batch
    /// dimensions broadcast by expanding both operands and flattening their batches, which
    /// copies an operand whose expanded batches cannot be flattened in place. The copies are
    /// real memory, so they happen here as they do there.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        // Register blocking pays once the output fills its 64x64 tiles; small products tile.
        let big = self.shape().iter().rev().nth(1).is_some_and(|&m| m >= 64) && other.shape().last().is_some_and(|&n| n >= 64);
        self.matmul_with(other, if big { MatmulKernel::Blocked } else { MatmulKernel::Tiled })
    }

    /// Self if its last two dimensions are row- or column-major with a valid leading dimension
    /// (`is_blas_compatible_*_order` in PyTorch), else a contiguous copy.
    #[track_caller]
    fn blas_compatible(&self) -> Result<Tensor> {
        let nd = self.ndim();
        let (rows, cols) = (self.shape()[nd - 2], self.shape()[nd - 1]);
        let (s0, s1) = (self.strides()[nd - 2], self.strides()[nd - 1]);
        let row_major = (s1 == 1 || cols == 1) && s0 >= cols.max(1);
        let col_major = (s0 == 1 || rows == 1) && s1 >= rows.max(1);
        if row_major || col_major || self.numel() == 0 { Ok(self.share()) } else { self.clone() }
    }

    /// `bmm`: batched matmul of two 3-D tensors with equal batch sizes.
    #[track_caller]
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        if self.ndim() != 3 || other.ndim() != 3 || self.shape()[0] != other.shape()[0] {
            return Err(TensorError::Shape(format!("bmm needs [b, n, m] @ [b, m, p], got {:?} @ {:?}", self.shape(), other.shape())));
        }
        self.matmul(other)
    }

    /// The last two dimensions swapped (`mT`).
    fn mt(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }

    #[track_caller]
    pub fn matmul_with(&self, other: &Tensor, kind: MatmulKernel) -> Result<Tensor> {
        self.same_device(other)?;
        if self.dtype != other.dtype {
            return Err(TensorError::DType(format!("matmul of {} and {}", self.dtype, other.dtype)));
        }
        if !self.dtype.is_float() {
            return Err(TensorError::DType(format!("matmul of {} tensors is not supported (floats only)", self.dtype)));
        }
        let (d1, d2) = (self.ndim(), other.ndim());
        if d1 == 0 || d2 == 0 {
            return Err(TensorError::Shape(format!("both arguments to matmul need to be at least 1D, but they are {d1}D and {d2}D")));
        }
        let k1 = self.shape()[d1 - 1];
        let k2 = if d2 == 1 { other.shape()[0] } else { other.shape()[d2 - 2] };
        if k1 != k2 {
            return Err(TensorError::Shape(format!("matmul: {:?} @ {:?}: inner dimensions {k1} and {k2} differ", self.shape(), other.shape())));
        }
        match (d1, d2) {
            // dot, mv, vector-matrix, mm: one product of matrices.
            (1, 1) => self.unsqueeze(0)?.mm(&other.unsqueeze(1)?, kind)?.view(&[]),
            (2, 1) => self.mm(&other.unsqueeze(1)?, kind)?.squeeze(Some(-1)),
            (1, 2) => self.unsqueeze(0)?.mm(other, kind)?.squeeze(Some(0)),
            (2, 2) => self.mm(other, kind),
            _ if self.should_fold(other) => {
                // The stack of matrices becomes one tall matrix (a view: should_fold checked).
                let transpose = d2 > d1;
                let t1 = if transpose { other.mt()? } else { self.share() };
                let t2 = if !transpose {
                    other.share()
                } else if d1 == 2 {
                    self.t()?
                } else {
                    self.share()
                };
                let mut out_shape: Vec<isize> = t1.shape()[..t1.ndim() - 1].iter().map(|&n| n as isize).collect();
                let folded: usize = t1.shape()[..t1.ndim() - 1].iter().product();
                let k = *t1.shape().last().expect("at least 3 dims");
                let t1_folded = t1.reshape(&[folded as isize, k as isize])?;
                if t2.ndim() == 2 {
                    out_shape.push(t2.shape()[1] as isize);
                    let out = t1_folded.mm(&t2, kind)?.view(&out_shape)?;
                    if transpose { out.mt()?.contiguous() } else { Ok(out) }
                } else {
                    t1_folded.mm(&t2.unsqueeze(1)?, kind)?.view(&out_shape)
                }
            }
            _ => {
                let n = if d1 > 1 { self.shape()[d1 - 2] } else { 1 };
                let p = if d2 > 1 { other.shape()[d2 - 1] } else { 1 };
                let batch = broadcast_shapes(&self.shape()[..d1.saturating_sub(2)], &other.shape()[..d2.saturating_sub(2)])?;
                let batches: usize = batch.iter().product();
                let with = |tail: &[usize]| batch.iter().chain(tail).copied().collect::<Vec<usize>>();
                let t1 = self.expand(&with(&[n, k1]))?.reshape(&[batches as isize, n as isize, k1 as isize])?;
                let t2 = if d2 == 1 {
                    other.expand(&with(&[k2]))?.reshape(&[batches as isize, k2 as isize])?.unsqueeze(2)?
                } else {
                    other.expand(&with(&[k2, p]))?.reshape(&[batches as isize, k2 as isize, p as isize])?
                };
                let mut out_shape: Vec<isize> = batch.iter().map(|&b| b as isize).collect();
                if d1 > 1 {
                    out_shape.push(n as isize);
                }
                if d2 > 1 {
                    out_shape.push(p as isize);
                }
                t1.mm(&t2, kind)?.view(&out_shape)
            }
        }
    }

    /// ATen's `should_fold`: whether a stack of matrices times a matrix (or vector) is done as one
    /// product, folding the stack's batches into rows, which needs no copy when the batch
    /// dimensions are contiguous with each other.
    fn should_fold(&self, other: &Tensor) -> bool {
        let larger = self.ndim() >= other.ndim();
        let Ok(t1) = (if larger { Ok(self.share()) } else { other.mt() }) else { return false };
        let small = if larger { other.ndim() } else { self.ndim() };
        if !(t1.ndim() >= 3 && small <= 2) || self.ndim() == 2 {
            return false;
        }
        if t1.numel() == 0 {
            return true;
        }
        (0..t1.ndim() - 2).all(|i| t1.strides()[i] == t1.strides()[i + 1] * t1.shape()[i + 1])
    }

    /// `mm` (2-D operands) or `bmm` (3-D, equal batches): one output allocation, after copies of
    /// operands cuBLAS could not take as they are.
    #[track_caller]
    fn mm(&self, other: &Tensor, kind: MatmulKernel) -> Result<Tensor> {
        let a = self.blas_compatible()?;
        let b = other.blas_compatible()?;
        let batch: Vec<usize> = a.shape()[..a.ndim() - 2].to_vec();
        let (m, k) = (a.shape()[a.ndim() - 2], a.shape()[a.ndim() - 1]);
        let n = b.shape()[b.ndim() - 1];
        let (la, lb) = (a.layout.clone(), b.layout.clone());
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        let out = self.device().empty_tensor(&out_shape, self.dtype, "matmul")?;
        let device = self.device().clone();
        let batches: usize = batch.iter().product();
        // A multiply and an add per term.
        let flops = [batches, m, n, k].iter().fold(2u64, |f, &d| f.saturating_mul(d as u64));
        if k == 0 {
            // A sum over nothing.
            out.fill_(0.0)?;
        } else if out.launches(&[&a, &b], flops) {
            for t in [&a, &b, &out] {
                check_u32(t)?;
            }
            let tile = 16u32;
            let bound = bind(&[&out, &a, &b])?;
            // 128-bit loads when both operands' rows are contiguous and 16-byte aligned.
            let nb = batch.len();
            let quad = |l: &Layout, base: u32, cols: usize, i: usize| {
                self.dtype == DType::F32
                    && bound.exclusive(i)
                    && l.strides[nb + 1] == 1
                    && cols.is_multiple_of(4)
                    && l.strides[nb].is_multiple_of(4)
                    && (base as usize + l.offset).is_multiple_of(4)
                    && l.strides[..nb].iter().all(|s| s.is_multiple_of(4))
            };
            let vec4 = kind == MatmulKernel::Blocked && quad(&la, bound.base(1), k, 1) && quad(&lb, bound.base(2), n, 2);
            let kernel = Kernel::new(Family::Matmul, kind.entry())
                .with("STAGE", if vec4 { "stage_vec4" } else { "stage_scalar" })
                .with_operands_vec4(&device, &bound, &[("c", self.dtype), ("a", self.dtype), ("b", self.dtype)], if vec4 { &["a", "b"] } else { &[] })?
                .with("ACC", "f32")
                .with("TILE", tile.to_string());
            let mut meta = vec![m as u32, n as u32, k as u32, batches as u32, batch.len() as u32];
            for d in 0..4 {
                meta.push(batch.get(d).copied().unwrap_or(1) as u32);
            }
            for (l, base) in [(&la, bound.base(1)), (&lb, bound.base(2)), (&out.layout, bound.base(0))] {
                let nb = batch.len();
                meta.push(base + l.offset as u32);
                for d in 0..4 {
                    meta.push(if d < nb { l.strides[d] as u32 } else { 0 });
                }
                meta.push(l.strides[nb] as u32);
                meta.push(l.strides[nb + 1] as u32);
            }
            let groups = match kind {
                MatmulKernel::Naive => [(n as u32).div_ceil(8), (m as u32).div_ceil(8), batches as u32],
                MatmulKernel::Tiled => [(n as u32).div_ceil(tile), (m as u32).div_ceil(tile), batches as u32],
                MatmulKernel::Blocked => [(n as u32).div_ceil(64), (m as u32).div_ceil(64), batches as u32],
            };
            kernels::dispatch_groups(&device, &kernel, &meta, &bound, groups)?;
        }
        Ok(out)
    }
}

/// Which matmul kernel: `matmul` picks Blocked or Tiled by size; Naive is the baseline the
/// benchmark compares them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    Naive,
    /// 16x16 workgroup tiles in shared memory.
    Tiled,
    /// 64x64 tiles, 4x4 outputs per invocation in registers.
    Blocked,
}

impl MatmulKernel {
    fn entry(self) -> &'static str {
        match self {
            MatmulKernel::Naive => "naive",
            MatmulKernel::Tiled => "tiled",
            MatmulKernel::Blocked => "blocked",
        }
    }
}

/// A rows-family entry point.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    Softmax,
    LogSoftmax,
    LayerNorm,
    Variance,
    Argmax,
}

impl Rows {
    fn entry(self) -> &'static str {
        match self {
            Rows::Softmax => "softmax",
            Rows::LogSoftmax => "log_softmax",
            Rows::LayerNorm => "layer_norm",
            Rows::Variance => "variance",
            Rows::Argmax => "argmax",
        }
    }
}

impl Tensor {
    /// Runs a rows kernel walking `dim` of self. `out` has self's shape, or self's with `dim`
    /// of size 1. `extras` are layer_norm's weight, bias, mean and rstd.
    fn rows(&self, kind: Rows, out: &Tensor, dim: usize, param: f32, extras: &[&Tensor]) -> Result<()> {
        let device = self.device().clone();
        let n = self.shape()[dim];
        let mut operands: Vec<&Tensor> = vec![out, self];
        operands.extend(extras);
        // Checked before anything runs, so that the sim device refuses what the GPU refuses.
        if n == 0 && out.numel() > 0 {
            return Err(TensorError::Shape(match kind {
                Rows::Argmax => format!("argmax(): Expected reduction dim {dim} to have non-zero size."),
                _ => format!("{} over an empty dimension", kind.entry()),
            }));
        }
        if !out.launches(&operands[1..], 0) {
            return Ok(());
        }
        for t in [self, out].into_iter().chain(extras.iter().copied()) {
            self.same_device(t)?;
            check_u32(t)?;
        }
        while operands.len() < 6 {
            operands.push(out);
        }
        let b = bind(&operands)?;
        let names = ["out", "a", "w", "b", "mean", "rstd"];
        let spec: Vec<(&str, DType)> = names.iter().zip(&operands).map(|(&n, t)| (n, t.dtype)).collect();
        let kernel = Kernel::new(Family::Rows, kind.entry()).with_operands(&device, &b, &spec)?;
        let mut row_shape = self.shape().to_vec();
        row_shape[dim] = 1;
        let rows = self.numel() / n;
        let mut out_layout = out.layout.clone();
        out_layout.shape = row_shape.clone();
        let mut meta = vec![rows as u32, self.ndim() as u32];
        push_shape(&mut meta, &row_shape);
        push_layout(&mut meta, &out_layout, b.base(0));
        push_layout(&mut meta, &self.layout, b.base(1));
        meta.extend([dim as u32, n as u32, param.to_bits()]);
        for (i, t) in operands.iter().enumerate().skip(2).take(2) {
            meta.push(b.base(i) + t.layout.offset as u32);
            meta.push(t.layout.strides.last().copied().unwrap_or(0) as u32);
        }
        meta.push(b.base(4) + operands[4].layout.offset as u32);
        meta.push(b.base(5) + operands[5].layout.offset as u32);
        Ok(kernels::dispatch(&device, &kernel, &meta, &b, rows as u64, WORKGROUP)?)
    }

    fn float_only(&self, op: &str) -> Result<()> {
        if !self.dtype.is_float() {
            return Err(TensorError::DType(format!("{op} of {} tensors: PyTorch requires a floating dtype", self.dtype)));
        }
        Ok(())
    }

    #[track_caller]
    fn along(&self, kind: Rows, dim: isize) -> Result<Tensor> {
        self.float_only(kind.entry())?;
        let d = wrap_dim(dim, self.ndim())?;
        let out = self.device().empty_tensor(self.shape(), self.dtype, kind.entry())?;
        self.rows(kind, &out, d, 0.0, &[])?;
        Ok(out)
    }

    /// `softmax(dim)`.
    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.along(Rows::Softmax, dim)
    }

    /// `log_softmax(dim)`.
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.along(Rows::LogSoftmax, dim)
    }

    /// `layer_norm` over the last dimension with weight and bias. Like PyTorch's
    /// native_layer_norm it also computes the per-row mean and 1/std (float32, one value per
    /// row), which autograd keeps for backward; here they are temporaries freed on return.
    #[track_caller]
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        self.float_only("layer_norm")?;
        let n = *self.shape().last().ok_or_else(|| TensorError::Shape("layer_norm of a 0-d tensor".into()))?;
        for (name, t) in [("weight", weight), ("bias", bias)] {
            if t.shape() != [n] || t.dtype != self.dtype {
                return Err(TensorError::Shape(format!("layer_norm {name} must be [{n}] {}, got {:?} {}", self.dtype, t.shape(), t.dtype)));
            }
        }
        let rows = self.numel() / n.max(1);
        let out = self.device().empty_tensor(self.shape(), self.dtype, "layer_norm")?;
        let mean = self.device().empty_tensor(&[rows], DType::F32, "layer_norm")?;
        let rstd = self.device().empty_tensor(&[rows], DType::F32, "layer_norm")?;
        self.rows(Rows::LayerNorm, &out, self.ndim() - 1, eps as f32, &[weight, bias, &mean, &rstd])?;
        Ok(out)
    }

    #[track_caller]
    fn reduce_rows(&self, kind: Rows, dim: isize, keepdim: bool, dtype: DType, param: f32) -> Result<Tensor> {
        let d = wrap_dim(dim, self.ndim())?;
        let mut shape = self.shape().to_vec();
        shape[d] = 1;
        let out = self.device().empty_tensor(&shape, dtype, kind.entry())?;
        self.rows(kind, &out, d, param, &[])?;
        if keepdim { Ok(out) } else { out.squeeze(Some(d as isize)) }
    }

    /// `var(dim, correction, keepdim)`: correction 1 is PyTorch's unbiased default.
    #[track_caller]
    pub fn var(&self, dim: isize, correction: f64, keepdim: bool) -> Result<Tensor> {
        self.float_only("var")?;
        let d = wrap_dim(dim, self.ndim())?;
        if self.shape()[d] == 0 {
            // The variance of nothing is NaN in PyTorch (with a warning), not an error.
            let mut shape = self.shape().to_vec();
            shape[d] = 1;
            let out = self.device().empty_tensor(&shape, self.dtype, Rows::Variance.entry())?;
            out.fill_(f64::NAN)?;
            return if keepdim { Ok(out) } else { out.squeeze(Some(d as isize)) };
        }
        self.reduce_rows(Rows::Variance, dim, keepdim, self.dtype, correction as f32)
    }

    /// `argmax(dim, keepdim)`: int64 indices, as in PyTorch.
    #[track_caller]
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_rows(Rows::Argmax, dim, keepdim, DType::I64, 0.0)
    }
}

impl Tensor {
    /// `torch.cat(tensors, dim)`: one output allocation; each input is copied into its slice.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = *tensors.first().ok_or_else(|| TensorError::Shape("cat of no tensors".into()))?;
        let d = wrap_dim(dim, first.ndim())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            first.same_device(t)?;
            let same = t.ndim() == first.ndim() && (0..t.ndim()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !same || t.dtype != first.dtype {
                return Err(TensorError::Shape(format!(
                    "cat: {:?} {} does not match {:?} {} outside dimension {d}",
                    t.shape(),
                    t.dtype,
                    first.shape(),
                    first.dtype
                )));
            }
            shape[d] += t.shape()[d];
        }
        let out = first.device().empty_tensor(&shape, first.dtype, "cat")?;
        let mut at = 0;
        for t in tensors {
            out.narrow(d as isize, at, t.shape()[d])?.copy_(t)?;
            at += t.shape()[d];
        }
        Ok(out)
    }

    /// `torch.stack(tensors, dim)`: cat of unsqueezed views (no extra memory).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let ndim = tensors.first().map_or(0, |t| t.ndim()) + 1;
        let d = wrap_dim(dim, ndim)? as isize;
        let views = tensors.iter().map(|t| t.unsqueeze(d)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&views.iter().collect::<Vec<_>>(), d)
    }

    /// `index_select(dim, index)`: `index` is a 1-D int64 or int32 tensor.
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        if index.ndim() != 1 || !matches!(index.dtype, DType::I64 | DType::I32) {
            return Err(TensorError::Shape(format!("index_select needs a 1-D int64 index, got {:?} {}", index.shape(), index.dtype)));
        }
        let d = wrap_dim(dim, self.ndim())?;
        let mut shape = self.shape().to_vec();
        shape[d] = index.numel();
        let out = self.device().empty_tensor(&shape, self.dtype, "index_select")?;
        let device = self.device().clone();
        self.same_device(index)?;
        // It reads the index and only the selected rows: as many bytes as it writes.
        if !out.launches(&[index, &out], 0) {
            return Ok(out);
        }
        if self.shape()[d] == 0 {
            return Err(TensorError::Shape("index_select from an empty dimension".into()));
        }
        for t in [self, index, &out] {
            check_u32(t)?;
        }
        let operands = [&out, self, index, &out];
        let b = bind(&operands)?;
        let spec = [("out", self.dtype), ("a", self.dtype), ("b", index.dtype), ("c", self.dtype)];
        let out_t = values(self.dtype, &device)?;
        let kernel = Kernel::new(Family::Elementwise, "gather")
            .with_operands(&device, &b, &spec)?
            .with("SCALAR", "info[SCALAR_AT]")
            .with("UNARY", format!("{out_t}(x)"))
            .with("BINARY", format!("{out_t}(x)"))
            .with("TERNARY", format!("{out_t}(x)"))
            .with("FILL", format!("{out_t}(s)"));
        let mut meta = vec![out.numel() as u32, out.ndim() as u32];
        push_shape(&mut meta, &shape);
        push_layout(&mut meta, &out.layout, b.base(0));
        push_layout(&mut meta, &self.layout, b.base(1));
        push_layout(&mut meta, &index.layout, b.base(2));
        // The C slot carries the selected dimension's size (for clamping).
        meta.push(self.shape()[d] as u32);
        meta.extend(std::iter::repeat_n(0, MAX_DIMS));
        meta.push(d as u32);
        meta.push(0);
        kernels::dispatch(&device, &kernel, &meta, &b, out.numel() as u64, ELEMENTWISE_WORKGROUP)?;
        Ok(out)
    }

    /// `F.embedding(ids, weight)`: rows of `self` (the weight) picked by `ids` of any shape.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.ndim() != 2 {
            return Err(TensorError::Shape(format!("embedding weight must be 2-D, got {:?}", self.shape())));
        }
        let flat = ids.reshape(&[-1])?;
        let rows = self.index_select(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&n| n as isize).collect();
        shape.push(self.shape()[1] as isize);
        rows.view(&shape)
    }
}

impl crate::device::Device {
    /// `torch.rand`: uniform in [0, 1), from the device's counter-based generator.
    #[track_caller]
    pub fn rand(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(shape, dtype, "rand", "uniform(i, 0u)")
    }

    /// `torch.randn`: standard normal.
    #[track_caller]
    pub fn randn(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.random(shape, dtype, "randn", "normal(i)")
    }

    #[track_caller]
    fn random(&self, shape: &[usize], dtype: DType, op: &'static str, expr: &str) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(TensorError::DType(format!("{op} makes floating tensors, not {dtype}")));
        }
        let t = self.empty_tensor(shape, dtype, op)?;
        let out_t = values(dtype, self).or_else(|e| if self.is_sim() { Ok("f32") } else { Err(e) })?;
        t.elementwise(Entry::Random(format!("{out_t}({expr})"), self.next_seed()), &[], 0.0)?;
        Ok(t)
    }
}
