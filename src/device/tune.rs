//! Which matmul kernel is fastest on this adapter, per class of shapes: measured at the class's
//! first use (`gpu/measure.rs`), remembered for the process and, natively, in a file per
//! machine (`gpu/tuning.rs`), so that only the first run on an adapter pays (tens of
//! milliseconds per class, not burn's cold autotune of seconds). The measurement runs on
//! scratch buffers created outside the caching allocator: a trace shows the program's memory,
//! not the tuner's. The kernels themselves are written in `kernels::matmul`; this is the
//! device's side, as cubecl keeps autotune in its runtime. Here: the choice and the classes.

use crate::dtype::DType;
use crate::kernels::loads_quads;
use crate::kernels::matmul::MatmulKernel;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How `matmul` picks its kernel on a GPU device.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum MatmulChoice {
    /// Measure the candidates at the first use of each class of shapes (the default).
    #[default]
    Measure,
    /// A fixed rule by output size, without measuring (see [`MatmulKernel::heuristic`]).
    Heuristic,
    /// Always this kernel.
    Fixed(MatmulKernel),
}

impl MatmulChoice {
    /// `measure`, `heuristic`, or a kernel's name (`register8x8`, `staged128k8db`, ...: see
    /// [`MatmulKernel::name`]).
    pub fn parse(text: &str) -> Result<MatmulChoice, String> {
        match text.trim() {
            "measure" => Ok(MatmulChoice::Measure),
            "heuristic" => Ok(MatmulChoice::Heuristic),
            name => MatmulKernel::from_name(name).map(MatmulChoice::Fixed).ok_or_else(|| {
                let kernels: Vec<String> = MatmulKernel::ALL.iter().map(|k| k.name()).collect();
                format!("TENSORMEM_MATMUL={name:?}: expected measure, heuristic or a kernel ({})", kernels.join(", "))
            }),
        }
    }

    /// `TENSORMEM_MATMUL`, where set: pins a kernel, or takes the rule without measuring (to
    /// rule the measurement out when something goes wrong on a new adapter).
    pub fn from_env() -> Result<Option<MatmulChoice>, String> {
        std::env::var("TENSORMEM_MATMUL").ok().filter(|v| !v.trim().is_empty()).map(|v| MatmulChoice::parse(&v)).transpose()
    }
}

/// Below this many rows or columns a matmul costs about one dispatch whatever the kernel: not
/// worth measuring.
const MEASURED_FROM: usize = 64;

/// Shapes that share a best kernel: dtype, each dimension's size class and whether the operands
/// allow 128-bit loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MatmulClass {
    pub(super) dtype: DType,
    /// Size classes of m, n, k: under 64, then each power of two up to 2,048, and more (the
    /// best kernel at 256 is not the best at 4,096: bigger tiles win once there are enough of
    /// them; on an H100 staged64k16db leads at 1,024 and staged128k8db, 1.3x faster than it, at 2,048).
    pub(super) dims: [u8; 3],
    pub(super) vec4: [bool; 2],
    /// Whether m and n are large enough to measure.
    pub(super) measured: bool,
    pub(super) heuristic: MatmulKernel,
}

impl MatmulClass {
    pub fn new(dtype: DType, m: usize, n: usize, k: usize, a_vec4: bool, b_vec4: bool) -> MatmulClass {
        // Powers of two from 64, 2,048 and more in one: 64..128 is 1, 1,024..2,048 is 5.
        let class = |d: usize| if d < 64 { 0 } else { (d.ilog2() - 5).min(6) as u8 };
        MatmulClass {
            dtype,
            dims: [class(m), class(n), class(k)],
            vec4: [a_vec4, b_vec4],
            measured: m >= MEASURED_FROM && n >= MEASURED_FROM,
            heuristic: MatmulKernel::heuristic(m, n),
        }
    }

    /// Contiguous operands: rows load four elements at a time when their length is a multiple
    /// of 4 (and the type allows it: `loads_quads`).
    pub fn contiguous(dtype: DType, native_f16: bool, m: usize, n: usize, k: usize) -> MatmulClass {
        let vec4 = |cols: usize| loads_quads(dtype, native_f16) && cols.is_multiple_of(4);
        MatmulClass::new(dtype, m, n, k, vec4(k), vec4(n))
    }
}

/// One measurement: each candidate's speed and the winner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatmulTuning {
    pub kernel: String,
    pub gflops: BTreeMap<String, f64>,
    /// How long measuring took, compiling the candidates' pipelines included.
    pub seconds: f64,
}
