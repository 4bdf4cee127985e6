//! Element types. Four run on the GPU (f32, f16, i32, u32); the others exist so that the
//! simulation device can account for the memory of programs that use them (a bf16 model, int64
//! token ids) exactly.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    U32,
    I8,
    U8,
    Bool,
}

impl DType {
    /// Bytes per element, as PyTorch's `element_size()`.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// The legacy tensor type name PyTorch's messages use for a CUDA tensor of this dtype
    /// (`torch.cuda.FloatTensor`).
    pub fn torch_type_name(self) -> &'static str {
        match self {
            DType::F32 => "torch.cuda.FloatTensor",
            DType::F16 => "torch.cuda.HalfTensor",
            DType::BF16 => "torch.cuda.BFloat16Tensor",
            DType::F64 => "torch.cuda.DoubleTensor",
            DType::I64 => "torch.cuda.LongTensor",
            DType::I32 => "torch.cuda.IntTensor",
            DType::U32 => "torch.cuda.UInt32Tensor",
            DType::I8 => "torch.cuda.CharTensor",
            DType::U8 => "torch.cuda.ByteTensor",
            DType::Bool => "torch.cuda.BoolTensor",
        }
    }

    /// Whether GPU kernels exist for it.
    pub fn runs_on_gpu(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::I32 | DType::U32)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// bool < integers < floats: a higher kind wins type promotion.
    pub(crate) fn kind(self) -> u8 {
        match self {
            DType::Bool => 0,
            _ if self.is_float() => 2,
            _ => 1,
        }
    }

    /// `torch.promote_types`: the smallest type both convert to without losing kind (f16 and
    /// f32 give f32, f16 and bf16 give f32, an integer and a float the float). None where
    /// PyTorch refuses (uint32 with another integer type or bool) or its answer is a type
    /// tensormem does not have (int16, for int8 with uint8).
    pub fn promote(self, other: DType) -> Option<DType> {
        use DType::*;
        if self == other {
            return Some(self);
        }
        if self.kind() != other.kind() {
            return Some(if self.kind() > other.kind() { self } else { other });
        }
        Some(match (self.min(other), self.max(other)) {
            (F16, BF16) => F32,
            // Declared order F32, F16, BF16, F64: F64 wins, else the wider of F32 and a half type.
            (a, F64) | (F64, a) if a.is_float() => F64,
            (F32, _) => F32,
            // PyTorch refuses uint32 with any other integer type.
            (_, U32) | (U32, _) => return None,
            (I64, _) => I64,
            (I32, I8 | U8) => I32,
            // int16, which tensormem does not have.
            _ => return None,
        })
    }

    /// Whether a value of this type can be written into `to` by an in-place op
    /// (`torch.can_cast`): not into a lower kind.
    pub fn can_cast(self, to: DType) -> bool {
        self.kind() <= to.kind()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Host element types that can move to and from a tensor.
pub trait Element: bytemuck::Pod + Copy + PartialEq + fmt::Debug + 'static {
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
