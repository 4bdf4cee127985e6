//! The elementwise ops, each declared once: one row of [`unary_ops!`] or [`binary_ops!`] below
//! gives an op's PyTorch name, the dtypes it takes, its autocast list, its WGSL expression and,
//! when autograd differentiates it, its node's name, what it saves and its backward rule. The
//! tensor layer runs the ops (`tensor::ops::elementwise`) and carries out the backward rules;
//! this module writes the WGSL: the scalar types ([`WgslScalar`]), the expressions, and the
//! elementwise kernel's specialisation (`shaders/elementwise.wgsl`).

use super::{BindingPlan, ELEMENTWISE_WORKGROUP, ElementwiseMeta, Family, Grid, Kernel, KernelError};
use crate::dtype::DType;
use std::fmt;

/// A WGSL scalar type: how values of a dtype are held in registers (see [`WgslScalar::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum WgslScalar {
    F32,
    F16,
    I32,
    U32,
}

impl WgslScalar {
    /// The type values of `dtype` have in registers: what `load_x` returns and `store_x` takes.
    /// f16 is f16 where the adapter has `shader-f16`, else f32; bf16 (which WGSL lacks) is f32,
    /// its top 16 bits stored; 8-bit types widen to 32 bits.
    pub fn of(dtype: DType, native_f16: bool) -> Result<WgslScalar, KernelError> {
        Ok(match dtype {
            DType::F32 | DType::BF16 => WgslScalar::F32,
            DType::F16 if native_f16 => WgslScalar::F16,
            DType::F16 => WgslScalar::F32,
            // int64 holds indices and token ids: kernels use the low 32 bits (checked on upload).
            DType::I32 | DType::I8 | DType::I64 => WgslScalar::I32,
            DType::U32 | DType::U8 | DType::Bool => WgslScalar::U32,
            other => {
                return Err(KernelError(format!(
                    "{other} tensors exist for memory accounting only; GPU kernels take float32, float16, bfloat16, int32, uint32, int8, uint8 and bool"
                )));
            }
        })
    }

    /// Its WGSL spelling.
    pub fn name(self) -> &'static str {
        match self {
            WgslScalar::F32 => "f32",
            WgslScalar::F16 => "f16",
            WgslScalar::I32 => "i32",
            WgslScalar::U32 => "u32",
        }
    }

    /// `expr` converted to this type.
    pub fn cast(self, expr: &str) -> String {
        format!("{self}({expr})")
    }

    /// How a kernel reads its scalar `s` as this type (from `scalar_bits`, the metadata's word).
    fn read_scalar(self) -> &'static str {
        match self {
            WgslScalar::F32 => "bitcast<f32>(scalar_bits)",
            WgslScalar::F16 => "f16(bitcast<f32>(scalar_bits))",
            WgslScalar::I32 => "bitcast<i32>(scalar_bits)",
            WgslScalar::U32 => "scalar_bits",
        }
    }

    /// The metadata word holding `value`, as [`read_scalar`](Self::read_scalar) reads it.
    fn scalar_bits(self, value: f64) -> u32 {
        match self {
            WgslScalar::F32 | WgslScalar::F16 => (value as f32).to_bits(),
            WgslScalar::I32 => (value as i32) as u32,
            WgslScalar::U32 => value as u32,
        }
    }
}

impl fmt::Display for WgslScalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dtypes an op is defined for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtypes {
    /// Every dtype kernels take.
    All,
    /// All but uint32 (neg).
    NotU32,
    /// Floating dtypes.
    Float,
}

impl Dtypes {
    pub fn allow(self, dtype: DType) -> bool {
        match self {
            Dtypes::All => true,
            Dtypes::NotU32 => dtype != DType::U32,
            Dtypes::Float => dtype.is_float(),
        }
    }
}

/// How autocast treats an op (PyTorch's autocast lists; the matmuls, on the lower-precision
/// list, are not elementwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Autocast {
    /// Runs in its inputs' type.
    Unlisted,
    /// On the float32 list: inputs are cast to f32 first.
    Fp32,
}

/// The result's dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// The type the op computes in (the input's; the operands' promoted type for binary ops).
    Computed,
    /// bool (comparisons: one byte per element, as in PyTorch).
    Bool,
}

/// A unary op's WGSL: an expression from x (the element, of the value type t), s (the scalar,
/// of t) and i (the linear index).
#[derive(Clone, Copy)]
pub(crate) enum UnaryWgsl {
    /// An expression of type t (given t).
    Typed(fn(WgslScalar) -> String),
    /// Float math, computed in f32 whatever the float type (f16 has too little range for exp in
    /// the middle of gelu): given x as an f32 expression; the result is converted back to t.
    Math(fn(&str) -> String),
    /// Conversion to the output's dtype (`to`): WGSL's float-to-int conversion truncates toward
    /// zero, as PyTorch's does; to bool, nonzero is 1.
    Cast,
}

/// What a unary op's backward needs, as `derivatives.yaml` writes its derivative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Saves {
    Nothing,
    /// The result (the derivative is written with it).
    Output,
    Input,
}

/// How a unary op's gradient is made from the output's gradient g, what the op saved and its
/// scalar s (as PyTorch computes it: the temporaries are real allocations).
#[derive(Clone, Copy)]
pub(crate) enum UnaryBackward {
    /// g itself.
    Grad,
    /// g * s.
    MulScalar,
    /// g / s.
    DivScalar,
    /// -g.
    Neg,
    /// g converted back to the input's dtype.
    CastBack,
    /// g * saved.
    MulSaved,
    /// g / saved.
    DivSaved,
    /// g / (2 * result), as PyTorch writes it (one temporary).
    Sqrt,
    /// -0.5 * g * result^3: PyTorch's two temporaries, then the product.
    Rsqrt,
    /// g * s * input^(s - 1) (zeros for s = 0), as PyTorch's pow_backward.
    PowScalar,
    /// A fused backward kernel (`threshold_backward(grad, result, 0)`, `tanh_backward`, ...):
    /// its name and the derivative in f32 from g, saved and s (see [`fused_backward`]).
    Fused(&'static str, fn(&str, &str, &str) -> String),
}

/// A differentiated unary op: its autograd node, what it saves, its backward.
#[derive(Clone, Copy)]
pub(crate) struct UnaryGrad {
    pub node: &'static str,
    pub saves: Saves,
    pub backward: UnaryBackward,
}

/// One unary op's declaration (its row in [`unary_ops!`]).
#[derive(Clone, Copy)]
pub(crate) struct UnaryDecl {
    pub name: &'static str,
    pub dtypes: Dtypes,
    pub autocast: Autocast,
    pub wgsl: UnaryWgsl,
    /// None: autograd does not differentiate it.
    pub grad: Option<UnaryGrad>,
}

/// How a binary op's gradients are made (each summed back to its input's shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinaryBackward {
    /// g, g: saves nothing.
    Add,
    /// g, alpha * g (g itself when alpha is 1, as `maybe_multiply`): saves nothing.
    AddScaled,
    /// g, -g: saves nothing.
    Sub,
    /// g * b, g * a: saves b if a needs a gradient, a if b does.
    Mul,
    /// g / b, -g * a / b / b: saves b, and a if b needs a gradient.
    Div,
}

/// A differentiated binary op: its autograd node and backward.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BinaryGrad {
    pub node: &'static str,
    pub backward: BinaryBackward,
}

/// One binary op's declaration (its row in [`binary_ops!`]).
#[derive(Clone, Copy)]
pub(crate) struct BinaryDecl {
    pub name: &'static str,
    pub dtypes: Dtypes,
    pub autocast: Autocast,
    pub output: Output,
    /// An expression from x and y (the operands' elements, both of the value type t given) and
    /// s (the scalar, alpha).
    pub wgsl: fn(WgslScalar) -> String,
    pub grad: Option<BinaryGrad>,
}

const fn grad(node: &'static str, saves: Saves, backward: UnaryBackward) -> Option<UnaryGrad> {
    Some(UnaryGrad { node, saves, backward })
}

const fn grad2(node: &'static str, backward: BinaryBackward) -> Option<BinaryGrad> {
    Some(BinaryGrad { node, backward })
}

/// Declares the unary ops: the enum and each variant's [`UnaryDecl`].
macro_rules! unary_ops {
    ($($(#[$doc:meta])* $op:ident { name: $name:literal, dtypes: $dtypes:ident, autocast: $autocast:ident, wgsl: $wgsl:expr, grad: $grad:expr $(,)? })*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Unary {
            $($(#[$doc])* $op,)*
        }

        impl Unary {
            /// The op's declaration.
            pub fn decl(self) -> UnaryDecl {
                use Saves::*;
                use UnaryBackward::*;
                use UnaryWgsl::*;
                match self {
                    $(Unary::$op => UnaryDecl { name: $name, dtypes: Dtypes::$dtypes, autocast: Autocast::$autocast, wgsl: $wgsl, grad: $grad },)*
                }
            }
        }
    };
}

/// Declares the binary ops: the enum and each variant's [`BinaryDecl`].
macro_rules! binary_ops {
    ($($(#[$doc:meta])* $op:ident { name: $name:literal, dtypes: $dtypes:ident, autocast: $autocast:ident, output: $output:ident, wgsl: $wgsl:expr, grad: $grad:expr $(,)? })*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Binary {
            $($(#[$doc])* $op,)*
        }

        impl Binary {
            /// The op's declaration.
            pub fn decl(self) -> BinaryDecl {
                use BinaryBackward::*;
                match self {
                    $(Binary::$op => BinaryDecl {
                        name: $name,
                        dtypes: Dtypes::$dtypes,
                        autocast: Autocast::$autocast,
                        output: Output::$output,
                        wgsl: $wgsl,
                        grad: $grad,
                    },)*
                }
            }
        }
    };
}

unary_ops! {
    Identity { name: "copy", dtypes: All, autocast: Unlisted, wgsl: Typed(|_| "x".into()), grad: None }
    /// Conversion to the output's dtype (`to(dtype)`).
    Cast { name: "to", dtypes: All, autocast: Unlisted, wgsl: Cast, grad: grad("ToCopyBackward0", Nothing, CastBack) }
    Neg { name: "neg", dtypes: NotU32, autocast: Unlisted, wgsl: Typed(|_| "-x".into()), grad: grad("NegBackward0", Nothing, Neg) }
    Abs {
        name: "abs",
        dtypes: All,
        autocast: Unlisted,
        wgsl: Typed(|_| "abs(x)".into()),
        grad: grad("AbsBackward0", Input, Fused("abs_backward", |g, y, _| format!("{g} * sign({y})"))),
    }
    Exp { name: "exp", dtypes: Float, autocast: Fp32, wgsl: Math(|x| format!("exp({x})")), grad: grad("ExpBackward0", Output, MulSaved) }
    Log { name: "log", dtypes: Float, autocast: Fp32, wgsl: Math(|x| format!("log({x})")), grad: grad("LogBackward0", Input, DivSaved) }
    Sqrt { name: "sqrt", dtypes: Float, autocast: Unlisted, wgsl: Math(|x| format!("sqrt({x})")), grad: grad("SqrtBackward0", Output, Sqrt) }
    Rsqrt { name: "rsqrt", dtypes: Float, autocast: Fp32, wgsl: Math(|x| format!("inverseSqrt({x})")), grad: grad("RsqrtBackward0", Output, Rsqrt) }
    Relu {
        name: "relu",
        dtypes: All,
        autocast: Unlisted,
        wgsl: Typed(|t| format!("max(x, {t}(0))")),
        grad: grad("ReluBackward0", Output, Fused("threshold_backward", |g, y, _| format!("select(0.0, {g}, {y} > 0.0)"))),
    }
    Gelu {
        name: "gelu",
        dtypes: Float,
        autocast: Unlisted,
        wgsl: Math(|x| format!("0.5 * {x} * (1.0 + erf_approx({x} * 0.7071067811865476))")),
        // d/dy [y * Phi(y)] = Phi(y) + y * phi(y).
        grad: grad("GeluBackward0", Input, Fused("gelu_backward", |g, y, _| {
            format!("{g} * (0.5 * (1.0 + erf_approx({y} * 0.7071067811865476)) + {y} * 0.3989422804014327 * exp(-0.5 * {y} * {y}))")
        })),
    }
    Silu {
        name: "silu",
        dtypes: Float,
        autocast: Unlisted,
        wgsl: Math(|x| format!("{x} / (1.0 + exp(-{x}))")),
        // d/dy [y * sigmoid(y)] = sigmoid(y) * (1 + y * (1 - sigmoid(y))).
        grad: grad("SiluBackward0", Input, Fused("silu_backward", |g, y, _| format!("{g} / (1.0 + exp(-{y})) * (1.0 + {y} * (1.0 - 1.0 / (1.0 + exp(-{y}))))"))),
    }
    Tanh {
        name: "tanh",
        dtypes: Float,
        autocast: Unlisted,
        wgsl: Math(|x| format!("tanh({x})")),
        grad: grad("TanhBackward0", Output, Fused("tanh_backward", |g, y, _| format!("{g} * (1.0 - {y} * {y})"))),
    }
    Sigmoid {
        name: "sigmoid",
        dtypes: Float,
        autocast: Unlisted,
        wgsl: Math(|x| format!("1.0 / (1.0 + exp(-{x}))")),
        grad: grad("SigmoidBackward0", Output, Fused("sigmoid_backward", |g, y, _| format!("{g} * (1.0 - {y}) * {y}"))),
    }
    Cos { name: "cos", dtypes: Float, autocast: Unlisted, wgsl: Math(|x| format!("cos({x})")), grad: None }
    Sin { name: "sin", dtypes: Float, autocast: Unlisted, wgsl: Math(|x| format!("sin({x})")), grad: None }
    /// The element's linear index (arange).
    Index { name: "arange", dtypes: All, autocast: Unlisted, wgsl: Typed(|t| format!("{t}(i)")), grad: None }
    AddScalar { name: "add", dtypes: All, autocast: Unlisted, wgsl: Typed(|_| "x + s".into()), grad: grad("AddBackward1", Nothing, Grad) }
    SubScalar { name: "sub", dtypes: All, autocast: Unlisted, wgsl: Typed(|_| "x - s".into()), grad: grad("SubBackward1", Nothing, Grad) }
    MulScalar { name: "mul", dtypes: All, autocast: Unlisted, wgsl: Typed(|_| "x * s".into()), grad: grad("MulBackward1", Nothing, MulScalar) }
    DivScalar { name: "div", dtypes: All, autocast: Unlisted, wgsl: Typed(|_| "x / s".into()), grad: grad("DivBackward1", Nothing, DivScalar) }
    PowScalar { name: "pow", dtypes: Float, autocast: Fp32, wgsl: Math(|x| format!("pow_signed({x}, f32(s))")), grad: grad("PowBackward0", Input, PowScalar) }
    MaxScalar {
        name: "clamp_min",
        dtypes: All,
        autocast: Unlisted,
        wgsl: Typed(|_| "max(x, s)".into()),
        grad: grad("ClampMinBackward0", Input, Fused("clamp_min_backward", |g, y, s| format!("select(0.0, {g}, {y} >= {s})"))),
    }
    MinScalar {
        name: "clamp_max",
        dtypes: All,
        autocast: Unlisted,
        wgsl: Typed(|_| "min(x, s)".into()),
        grad: grad("ClampMaxBackward0", Input, Fused("clamp_max_backward", |g, y, s| format!("select(0.0, {g}, {y} <= {s})"))),
    }
}

binary_ops! {
    Add { name: "add", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |_| "x + y".into(), grad: grad2("AddBackward0", Add) }
    /// `add(other, alpha=s)`: x + s * y.
    AddScaled { name: "add", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |t| format!("x + {t}(s) * y"), grad: grad2("AddBackward0", AddScaled) }
    /// `_add_relu`: relu(x + y), one kernel and one output.
    AddRelu { name: "_add_relu", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |t| format!("max(x + y, {t}(0))"), grad: None }
    Sub { name: "sub", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |_| "x - y".into(), grad: grad2("SubBackward0", Sub) }
    Mul { name: "mul", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |_| "x * y".into(), grad: grad2("MulBackward0", Mul) }
    Div { name: "div", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |_| "x / y".into(), grad: grad2("DivBackward0", Div) }
    Pow { name: "pow", dtypes: Float, autocast: Fp32, output: Computed, wgsl: |t| format!("{t}(pow_signed(f32(x), f32(y)))"), grad: None }
    Maximum { name: "maximum", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |_| "max(x, y)".into(), grad: None }
    Minimum { name: "minimum", dtypes: All, autocast: Unlisted, output: Computed, wgsl: |_| "min(x, y)".into(), grad: None }
    Eq { name: "eq", dtypes: All, autocast: Unlisted, output: Bool, wgsl: |_| compare("=="), grad: None }
    Ne { name: "ne", dtypes: All, autocast: Unlisted, output: Bool, wgsl: |_| compare("!="), grad: None }
    Lt { name: "lt", dtypes: All, autocast: Unlisted, output: Bool, wgsl: |_| compare("<"), grad: None }
    Le { name: "le", dtypes: All, autocast: Unlisted, output: Bool, wgsl: |_| compare("<="), grad: None }
    Gt { name: "gt", dtypes: All, autocast: Unlisted, output: Bool, wgsl: |_| compare(">"), grad: None }
    Ge { name: "ge", dtypes: All, autocast: Unlisted, output: Bool, wgsl: |_| compare(">="), grad: None }
}

/// A comparison's result as a bool element (0 or 1).
fn compare(op: &str) -> String {
    format!("select(0u, 1u, x {op} y)")
}

impl Unary {
    pub fn name(self) -> &'static str {
        self.decl().name
    }

    /// The WGSL expression giving `out` (the output dtype `out_dtype`'s value type, which
    /// differs from `t` only for Cast) from x (an element of `dtype`, held as `t`), s and i.
    /// None where the op is not defined for `dtype`.
    pub fn wgsl(self, dtype: DType, t: WgslScalar, out: WgslScalar, out_dtype: DType) -> Option<String> {
        let decl = self.decl();
        if !decl.dtypes.allow(dtype) {
            return None;
        }
        Some(match decl.wgsl {
            UnaryWgsl::Typed(expr) => expr(t),
            UnaryWgsl::Math(expr) if t == WgslScalar::F32 => expr("x"),
            UnaryWgsl::Math(expr) => t.cast(&expr("f32(x)")),
            UnaryWgsl::Cast if out_dtype == DType::Bool => format!("select(0u, 1u, x != {t}(0))"),
            UnaryWgsl::Cast => out.cast("x"),
        })
    }
}

impl BinaryBackward {
    /// Whether the backward needs the inputs (then an in-place form, which overwrites one, is
    /// not differentiated).
    pub fn saves_inputs(self) -> bool {
        matches!(self, BinaryBackward::Mul | BinaryBackward::Div)
    }
}

impl Binary {
    pub fn name(self) -> &'static str {
        self.decl().name
    }

    /// The result's dtype when the operands' promoted type is `computed`.
    pub fn out_dtype(self, computed: DType) -> DType {
        match self.decl().output {
            Output::Computed => computed,
            Output::Bool => DType::Bool,
        }
    }

    /// The WGSL expression from x and y (elements of `dtype`, held as `t`) and s. None where
    /// the op is not defined for `dtype`.
    pub fn wgsl(self, dtype: DType, t: WgslScalar) -> Option<String> {
        let decl = self.decl();
        decl.dtypes.allow(dtype).then(|| (decl.wgsl)(t))
    }
}

/// A fused backward kernel's expression (see [`UnaryBackward::Fused`]): the derivative computed
/// in f32 from the gradient (x), the saved tensor (y) and the scalar, converted to `t`.
pub(crate) fn fused_backward(t: WgslScalar, derivative: fn(&str, &str, &str) -> String) -> String {
    t.cast(&derivative("f32(x)", "f32(y)", "bitcast<f32>(scalar_bits)"))
}

/// The fused elementwise ops' expressions (one kernel where the composite would take several;
/// their ops are in `tensor::ops`: `fused`, `random`, `index`, `factory`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fused {
    /// `masked_fill`: x where the bool mask y is false, s where it is true. s passes as bits:
    /// -inf and NaN, which a WGSL constant cannot be.
    MaskedFill,
    /// The gradient x where the bool mask y is `kept_where`, zero elsewhere (the backward of
    /// where and masked_fill).
    KeptWhere(bool),
    /// x * y * s: x scaled where the bool mask y keeps it (dropout and its backward).
    MaskedScale,
    /// Dropout's keep mask: 1 where a uniform draw is at least p.
    DropoutMask(f32),
    /// `torch.rand`: uniform in [0, 1).
    Uniform,
    /// `torch.randn`: standard normal.
    Normal,
    /// `nll_loss_backward`: x the row's target, broadcast along the row, clamped as the forward
    /// clamps it; i % s the element's class; -y / z (the gradient over the total weight) at the
    /// target, zero elsewhere and on ignored rows (target -100).
    NllLossBackward,
}

impl Fused {
    /// `torch.where(x, y, z)`: y where the bool condition x is true, else z (of any type).
    pub const WHERE: &'static str = "select(z, y, x != 0u)";

    /// The expression, of the value type `t` (the output's).
    pub fn wgsl(self, t: WgslScalar) -> String {
        match self {
            Fused::MaskedFill => format!("select(x, {t}(bitcast<f32>(scalar_bits)), y != 0u)"),
            Fused::KeptWhere(kept_where) => format!("select({t}(0), x, y {} 0u)", if kept_where { "!=" } else { "==" }),
            Fused::MaskedScale => format!("{t}(f32(x) * f32(y) * bitcast<f32>(scalar_bits))"),
            Fused::DropoutMask(p) => format!("select(0u, 1u, uniform(i, 0u) >= {p:?})"),
            Fused::Uniform => t.cast("uniform(i, 0u)"),
            Fused::Normal => t.cast("normal(i)"),
            Fused::NllLossBackward => format!("select({t}(0), -y / z, x != -100 && u32(clamp(x, 0, s - 1)) == i % u32(s))"),
        }
    }
}

/// The optimizers' fused in-place updates: self's new value from x (self), y, z and s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    /// `add_(y, alpha=s)`.
    Add,
    /// `lerp_(y, weight=s)` (Adam's first moment).
    Lerp,
    /// `addcdiv_(y, z, value=s)`.
    Addcdiv,
    /// `addcmul_(y, z, value=s)`.
    Addcmul,
}

impl Update {
    /// The op's name and expression.
    pub fn decl(self) -> (&'static str, &'static str) {
        match self {
            Update::Add => ("add_", "x + s * y"),
            Update::Lerp => ("lerp_", "x + s * (y - x)"),
            Update::Addcdiv => ("addcdiv_", "x + s * y / z"),
            Update::Addcmul => ("addcmul_", "x + s * y * z"),
        }
    }
}

/// Which elementwise entry runs, with its expression (the others get a trivial one: every entry
/// compiles with the module).
pub(crate) enum Entry {
    Unary(String),
    Binary(String),
    /// A binary expression over operands of different types, both converted to the given value
    /// type first (PyTorch's type promotion).
    Promoted(String, WgslScalar),
    Ternary(String),
    Fill,
    /// Random numbers from `expr` (using `uniform(i, lane)` / `normal(i)`) and a seed.
    Random(String, u32),
    /// The gradient scaler's unscale and inf/NaN check.
    Unscale,
}

impl Entry {
    /// Whether the entry has a contiguous four-at-a-time form (`quads`).
    pub fn has_quads(&self) -> bool {
        !matches!(self, Entry::Unscale)
    }
}

/// The operands of every elementwise kernel, in binding order: the output, then up to three
/// inputs (unused slots repeat the output, so that every accessor the module declares exists).
pub(crate) const ELEMENTWISE_OPERANDS: [&str; 4] = ["out", "a", "b", "c"];

/// Quads (4 elements) a workgroup of the contiguous `quads` entry covers: four per invocation
/// (shaders/elementwise.wgsl).
const QUADS_PER_GROUP: u64 = 4 * ELEMENTWISE_WORKGROUP as u64;

/// An elementwise kernel ready to launch: the kernel, and the scalar and seed words of its
/// metadata.
pub(crate) struct ElementwiseKernel {
    pub kernel: Kernel,
    pub scalar_bits: u32,
    pub seed: u32,
}

impl ElementwiseKernel {
    /// The kernel running `entry` over operands of `dtypes` (see [`ELEMENTWISE_OPERANDS`];
    /// `inputs` of them are real inputs) bound as `plan` says, with the scalar `scalar`: read
    /// as the first input's value type (the output's for fill), or as the promoted type of
    /// mixed operands. `quads`: the contiguous four-at-a-time form (the caller checked the
    /// operands' layouts and alignment).
    pub fn new(
        entry: Entry,
        dtypes: [DType; 4],
        inputs: usize,
        scalar: f64,
        native_f16: bool,
        plan: &BindingPlan,
        quads: bool,
    ) -> Result<ElementwiseKernel, KernelError> {
        let (mut seed, mut promote) = (0, None);
        let (entry_name, expr) = match entry {
            Entry::Unary(e) => ("unary", e),
            Entry::Binary(e) => ("binary", e),
            Entry::Promoted(e, t) => {
                promote = Some(t);
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
        let scalar_type = match promote {
            Some(t) => t,
            None => WgslScalar::of(dtypes[if inputs == 0 { 0 } else { 1 }], native_f16)?,
        };
        let out_t = WgslScalar::of(dtypes[0], native_f16)?;
        // The contiguous form is one entry, `quads`, specialised by the op family it runs.
        let (quad_family, entry, vec4): (&str, &str, &[&'static str]) =
            if quads { (entry_name, "quads", &ELEMENTWISE_OPERANDS) } else { ("fill", entry_name, &[]) };
        let spec: Vec<(&'static str, DType)> = ELEMENTWISE_OPERANDS.into_iter().zip(dtypes).collect();
        let kernel = Kernel::new(Family::Elementwise, entry)
            .with_meta::<ElementwiseMeta>()
            .with_operands_vec4(native_f16, plan, &spec, vec4)?
            .with("SCALAR", scalar_type.read_scalar())
            .with_elementwise_entries(out_t, entry_name, expr, promote, quad_family);
        Ok(ElementwiseKernel { kernel, scalar_bits: scalar_type.scalar_bits(scalar), seed })
    }

    /// The kernel of one of the index entries of the elementwise family (gather, scatter_add,
    /// nll_loss), over operands of `dtypes` bound as `plan` says: they run no expression, and
    /// read their scalar (a dimension, a count) as a word.
    pub fn indexing(entry: &'static str, dtypes: [DType; 4], native_f16: bool, plan: &BindingPlan) -> Result<Kernel, KernelError> {
        let spec: Vec<(&'static str, DType)> = ELEMENTWISE_OPERANDS.into_iter().zip(dtypes).collect();
        let out_t = WgslScalar::of(dtypes[0], native_f16)?;
        Ok(Kernel::new(Family::Elementwise, entry)
            .with_meta::<ElementwiseMeta>()
            .with_operands(native_f16, plan, &spec)?
            .with("SCALAR", "info.scalar")
            .with_elementwise_entries(out_t, entry, String::new(), None, "fill"))
    }

    /// The launch grid over `numel` elements (`quads`: the four-at-a-time form, see
    /// `QUADS_PER_GROUP`).
    pub fn grid(numel: usize, quads: bool) -> Grid {
        let threads = if quads { (numel as u64).div_ceil(QUADS_PER_GROUP * 4) * ELEMENTWISE_WORKGROUP as u64 } else { numel as u64 };
        Grid::Threads { threads, workgroup: ELEMENTWISE_WORKGROUP }
    }
}

impl Kernel {
    /// The elementwise module's expressions: `expr` for the entry `running` (unary, binary,
    /// ternary or fill), a trivial one (a conversion to the output's type `out_t`) for the
    /// others; the promotion of mixed binary operands; the family the `quads` entry runs.
    fn with_elementwise_entries(self, out_t: WgslScalar, running: &str, expr: String, promote: Option<WgslScalar>, quad_family: &'static str) -> Kernel {
        let pick = |name: &str, trivial: &str| if name == running { expr.clone() } else { out_t.cast(trivial) };
        self.with("UNARY", pick("unary", "x"))
            .with("BINARY", pick("binary", "x"))
            .with("PROMOTE", promote.map_or("", WgslScalar::name))
            .with("TERNARY", pick("ternary", "x"))
            .with("FILL", pick("fill", "s"))
            .with("QUADS", quad_family)
    }
}
