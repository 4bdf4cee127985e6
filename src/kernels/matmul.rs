//! The register-blocked matmul's body (`shaders/matmul_register.wgsl`), written out for a tile
//! size: WGSL has no way to keep a loop-indexed array in registers, so each accumulator, row
//! offset and load is its own named value. Also the matmul kernels' choice of variant
//! ([`MatmulKernel`]) and their specialisation for a launch ([`matmul_kernel`]); the device
//! measures which variant is fastest (`device::tune`).

use super::{BindingPlan, Family, Kernel, KernelError, MatmulMeta};
use crate::dtype::DType;
use std::fmt::Write;

/// A TM x TN block of C per invocation (TN a multiple of 4: one vec4 accumulator per four
/// columns), and whether A's rows (along k) and B's rows (along n) are read 128 bits at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RegisterTile {
    pub rows: u32,
    pub cols: u32,
    pub a_vec4: bool,
    pub b_vec4: bool,
}

impl RegisterTile {
    /// Workgroups per dimension: 8 x 8 invocations, each a tile.
    pub fn groups(&self, m: usize, n: usize) -> [u32; 2] {
        [(n as u32).div_ceil(self.cols * 8), (m as u32).div_ceil(self.rows * 8)]
    }

    /// The kernel body after the template's prologue (which defines row0, col0, the operands'
    /// batch offsets ao / bo / co and strides).
    pub fn body(&self) -> String {
        let (tm, quads) = (self.rows, self.cols / 4);
        let mut s = String::new();
        let w = &mut s;
        // Rows and columns past the edge read the last one, so the k loop needs no checks; their
        // sums are not stored.
        for r in 0..tm {
            let _ = writeln!(w, "    let ar{r} = ao + min(row0 + {r}u, m - 1u) * ars;");
        }
        for q in 0..quads {
            if self.b_vec4 {
                // B's row stride, offset and n are multiples of 4 here.
                let _ = writeln!(w, "    let bq{q} = bo / 4u + min(col0 / 4u + {q}u, n / 4u - 1u);");
            } else {
                for j in 0..4 {
                    let _ = writeln!(w, "    let bc{q}_{j} = bo + min(col0 + {}u, n - 1u) * bcs;", q * 4 + j);
                }
            }
            for r in 0..tm {
                let _ = writeln!(w, "    var acc{r}_{q} = vec4<f32>(0.0);");
            }
        }
        let b_row = |w: &mut String, q: u32, kk: &str| {
            if self.b_vec4 {
                let _ = writeln!(w, "        let b{q} = load4_b(bq{q} + ({kk}) * (brs / 4u));");
            } else {
                let l = |j: u32| format!("f32(load_b(bc{q}_{j} + ({kk}) * brs))");
                let _ = writeln!(w, "        let b{q} = vec4<f32>({}, {}, {}, {});", l(0), l(1), l(2), l(3));
            }
        };
        // Four steps of k per iteration: one vec4 of each A row feeds 4 x TN products.
        let _ = writeln!(w, "    for (var kk = 0u; kk + 4u <= k; kk = kk + 4u) {{");
        for r in 0..tm {
            if self.a_vec4 {
                let _ = writeln!(w, "        let a{r} = load4_a((ar{r} + kk) / 4u);");
            } else {
                let l = |j: u32| format!("f32(load_a(ar{r} + (kk + {j}u) * acs))");
                let _ = writeln!(w, "        let a{r} = vec4<f32>({}, {}, {}, {});", l(0), l(1), l(2), l(3));
            }
        }
        for j in 0..4 {
            let _ = writeln!(w, "        {{");
            for q in 0..quads {
                b_row(w, q, &format!("kk + {j}u"));
            }
            for r in 0..tm {
                for q in 0..quads {
                    let _ = writeln!(w, "        acc{r}_{q} = fma(vec4<f32>(a{r}[{j}]), b{q}, acc{r}_{q});");
                }
            }
            let _ = writeln!(w, "        }}");
        }
        let _ = writeln!(w, "    }}");
        // The last k % 4 steps (none when A's rows load as vec4: k is a multiple of 4 then).
        if !self.a_vec4 {
            let _ = writeln!(w, "    for (var kk = k - k % 4u; kk < k; kk = kk + 1u) {{");
            for q in 0..quads {
                b_row(w, q, "kk");
            }
            for r in 0..tm {
                let _ = writeln!(w, "        let a{r} = vec4<f32>(f32(load_a(ar{r} + kk * acs)));");
                for q in 0..quads {
                    let _ = writeln!(w, "        acc{r}_{q} = fma(a{r}, b{q}, acc{r}_{q});");
                }
            }
            let _ = writeln!(w, "    }}");
        }
        for r in 0..tm {
            let _ = writeln!(w, "    if (row0 + {r}u < m) {{");
            let _ = writeln!(w, "        let cr = co + (row0 + {r}u) * info.c.row_stride;");
            for q in 0..quads {
                for j in 0..4 {
                    let col = q * 4 + j;
                    let _ = writeln!(w, "        if (col0 + {col}u < n) {{ store_c(cr + (col0 + {col}u) * info.c.col_stride, c_t(acc{r}_{q}[{j}])); }}");
                }
            }
            let _ = writeln!(w, "    }}");
        }
        s
    }
}

/// The kernel `kind` specialised for these operands (`vec4`: whether A and B load four elements
/// at a time) and its workgroup grid for an m x n output, `batches` deep.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_kernel(
    kind: MatmulKernel,
    dtype: DType,
    native_f16: bool,
    plan: &BindingPlan,
    [a_vec4, b_vec4]: [bool; 2],
    m: usize,
    n: usize,
    batches: usize,
) -> Result<(Kernel, [u32; 3]), KernelError> {
    let operands = [("c", dtype), ("a", dtype), ("b", dtype)];
    // The operands whose rows load 128 bits at a time (the register and staged kernels).
    let vec4: Vec<&'static str> = [("a", a_vec4), ("b", b_vec4)].iter().filter(|v| v.1).map(|v| v.0).collect();
    Ok(match kind {
        MatmulKernel::Register { rows, cols } => {
            let tile = RegisterTile { rows, cols, a_vec4, b_vec4 };
            let kernel = Kernel::new(Family::MatmulRegister, kind.entry())
                .with_meta::<MatmulMeta>()
                .with_operands_vec4(native_f16, plan, &operands, &vec4)?
                .with_register_tile(tile);
            let [x, y] = tile.groups(m, n);
            (kernel, [x, y, batches as u32])
        }
        MatmulKernel::Staged => {
            // Four elements into v: one 128-bit load where the rows allow it (k, or n, a multiple
            // of 4 then), else four strided ones.
            let load_a = if a_vec4 {
                "if (kq < info.k) { v = load4_a((ao + r * info.a.row_stride + kq) / 4u); }"
            } else {
                "for (var j = 0u; j < 4u; j = j + 1u) { if (kq + j < info.k) { v[j] = f32(load_a(ao + r * info.a.row_stride + (kq + j) * info.a.col_stride)); } }"
            };
            let load_b = if b_vec4 {
                "v = load4_b((bo + kr * info.b.row_stride + min(c, info.n - 4u)) / 4u);"
            } else {
                "for (var j = 0u; j < 4u; j = j + 1u) { v[j] = f32(load_b(bo + kr * info.b.row_stride + min(c + j, info.n - 1u) * info.b.col_stride)); }"
            };
            let kernel = Kernel::new(Family::MatmulStaged, kind.entry())
                .with_meta::<MatmulMeta>()
                .with_operands_vec4(native_f16, plan, &operands, &vec4)?
                .with("LOAD_A", load_a)
                .with("LOAD_B", load_b);
            (kernel, [(n as u32).div_ceil(128), (m as u32).div_ceil(128), batches as u32])
        }
        _ => {
            let vec4 = kind == MatmulKernel::Blocked && a_vec4 && b_vec4;
            let kernel = Kernel::new(Family::Matmul, kind.entry())
                .with_meta::<MatmulMeta>()
                .with("STAGE", if vec4 { "stage_vec4" } else { "stage_scalar" })
                .with_operands_vec4(native_f16, plan, &operands, if vec4 { &["a", "b"] } else { &[] })?
                .with("ACC", "f32")
                .with("TILE", "16");
            let edge = match kind {
                MatmulKernel::Naive => 8,
                MatmulKernel::Tiled => 16,
                _ => 64,
            };
            (kernel, [(n as u32).div_ceil(edge), (m as u32).div_ceil(edge), batches as u32])
        }
    })
}

/// Which matmul kernel. `matmul` picks one per adapter and class of shapes, measuring the
/// candidates at first use (see `device::tune`); Naive is the baseline the benchmark compares
/// them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatmulKernel {
    /// One invocation per output element.
    Naive,
    /// 16x16 workgroup tiles in shared memory.
    Tiled,
    /// 64x64 tiles in shared memory, 4x4 outputs per invocation in registers.
    Blocked,
    /// No shared memory: `rows` x `cols` outputs per invocation in registers, straight-line
    /// code, 128-bit loads where the operands allow.
    Register { rows: u32, cols: u32 },
    /// 128x128 tiles staged in shared memory eight steps of k at a time, 8x8 outputs per
    /// invocation in registers: each element read from global memory once per workgroup.
    Staged,
}

impl MatmulKernel {
    /// Every variant (the tests check each against the CPU reference).
    pub const ALL: [MatmulKernel; 7] = [
        MatmulKernel::Naive,
        MatmulKernel::Tiled,
        MatmulKernel::Blocked,
        MatmulKernel::Staged,
        MatmulKernel::Register { rows: 8, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 4 },
    ];

    /// The variants measured at first use of a class of shapes: the naive and tiled kernels
    /// never win, and measuring them would make first calls slow.
    pub const CANDIDATES: [MatmulKernel; 5] = [
        MatmulKernel::Register { rows: 8, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 4 },
        MatmulKernel::Staged,
        MatmulKernel::Blocked,
    ];

    /// The kernel for an m x n output without measuring: best on the adapters we have measured
    /// (lavapipe, SwiftShader), used where no measurement is possible or worth it.
    pub fn heuristic(m: usize, n: usize) -> MatmulKernel {
        if m >= 64 && n >= 64 { MatmulKernel::Register { rows: 8, cols: 8 } } else { MatmulKernel::Register { rows: 4, cols: 4 } }
    }

    /// The variant called `name` (see `name`).
    pub fn from_name(name: &str) -> Option<MatmulKernel> {
        MatmulKernel::ALL.into_iter().find(|k| k.name() == name)
    }

    fn entry(self) -> &'static str {
        match self {
            MatmulKernel::Naive => "naive",
            MatmulKernel::Tiled => "tiled",
            MatmulKernel::Blocked => "blocked",
            MatmulKernel::Staged => "staged",
            MatmulKernel::Register { .. } => "registers",
        }
    }

    /// A short name: naive, tiled, blocked, staged, register8x8.
    pub fn name(self) -> String {
        match self {
            MatmulKernel::Register { rows, cols } => format!("register{rows}x{cols}"),
            other => other.entry().to_string(),
        }
    }
}
