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

/// A staged kernel's shape (`shaders/matmul_staged.wgsl`): `tile` x `tile` blocks of C per
/// workgroup of 16 x 16 invocations, `depth` steps of k staged in workgroup memory at a time,
/// in one buffer or two (the next steps loaded while the current ones are multiplied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StagedTile {
    pub tile: u32,
    pub depth: u32,
    pub buffers: u32,
}

impl StagedTile {
    /// Quads (vec4) of one operand's block in one buffer.
    fn quads(&self) -> u32 {
        self.tile * self.depth / 4
    }

    /// Workgroup memory the kernel declares: both operands' blocks, in every buffer.
    pub fn workgroup_bytes(&self) -> u32 {
        2 * self.quads() * self.buffers * 16
    }

    /// The kernel body after the template's prologue (which defines t, the invocation's index,
    /// and the operands' batch offsets ao / bo / co).
    pub fn body(&self) -> String {
        let (tile, depth) = (self.tile, self.depth);
        // Each invocation: `groups` x `groups` quads of rows and columns, 64 apart (16
        // invocations of 4 each), so that neighbours read neighbouring vec4s of the blocks.
        let groups = tile / 64;
        let rows = groups * 4;
        let row_quads = tile / 4;
        // Quads each invocation stages per operand (256 invocations).
        let staged = self.quads() / 256;
        assert!(self.quads().is_multiple_of(256) && tile.is_multiple_of(64) && depth.is_multiple_of(4), "{self:?} does not divide among 256 invocations");
        let mut s = String::new();
        let w = &mut s;
        let _ = writeln!(w, "    let row0 = wid.y * {tile}u;");
        let _ = writeln!(w, "    let col0 = wid.x * {tile}u;");
        // What the invocation stages: A's quad i at row sa_r{i} (sa_row{i} in A, the last row
        // past m), k from sa_k{i}; B's at row sb_k{i}, columns from quad sb_q{i} of the block.
        for i in 0..staged {
            let _ = writeln!(w, "    let sa_r{i} = (t + {}u) / {}u;", i * 256, depth / 4);
            let _ = writeln!(w, "    let sa_k{i} = ((t + {}u) % {}u) * 4u;", i * 256, depth / 4);
            let _ = writeln!(w, "    let sa_row{i} = min(row0 + sa_r{i}, info.m - 1u);");
            let _ = writeln!(w, "    let sb_k{i} = (t + {}u) / {row_quads}u;", i * 256);
            let _ = writeln!(w, "    let sb_q{i} = (t + {}u) % {row_quads}u;", i * 256);
            let _ = writeln!(w, "    var pa{i}: vec4<f32>;");
            let _ = writeln!(w, "    var pb{i}: vec4<f32>;");
        }
        for r in 0..rows {
            for h in 0..groups {
                let _ = writeln!(w, "    var acc{r}_{h} = vec4<f32>(0.0);");
            }
        }
        let fetch = |w: &mut String, k0: &str| {
            for i in 0..staged {
                let _ = writeln!(w, "        pa{i} = quad_a(ao, sa_row{i}, {k0} + sa_k{i});");
                let _ = writeln!(w, "        pb{i} = quad_b(bo, {k0} + sb_k{i}, col0 + sb_q{i} * 4u);");
            }
        };
        let stash = |w: &mut String, base: &str| {
            for i in 0..staged {
                for j in 0..4 {
                    let _ = writeln!(w, "        tile_a[{base}(sa_k{i} + {j}u) * {row_quads}u + sa_r{i} / 4u][sa_r{i} % 4u] = pa{i}[{j}];");
                }
                let _ = writeln!(w, "        tile_b[{base}sb_k{i} * {row_quads}u + sb_q{i}] = pb{i};");
            }
        };
        let multiply = |w: &mut String, base: &str| {
            for kk in 0..depth {
                let _ = writeln!(w, "        {{");
                for g in 0..groups {
                    let _ = writeln!(w, "            let a{g} = tile_a[{base}{}u + lid.y];", kk * row_quads + g * 16);
                    let _ = writeln!(w, "            let b{g} = tile_b[{base}{}u + lid.x];", kk * row_quads + g * 16);
                }
                for r in 0..rows {
                    for h in 0..groups {
                        let _ = writeln!(w, "            acc{r}_{h} = fma(vec4<f32>(a{}[{}]), b{h}, acc{r}_{h});", r / 4, r % 4);
                    }
                }
                let _ = writeln!(w, "        }}");
            }
        };
        if self.buffers == 1 {
            let _ = writeln!(w, "    for (var k0 = 0u; k0 < info.k; k0 = k0 + {depth}u) {{");
            fetch(w, "k0");
            stash(w, "");
            let _ = writeln!(w, "        workgroupBarrier();");
            multiply(w, "");
            let _ = writeln!(w, "        workgroupBarrier();");
            let _ = writeln!(w, "    }}");
        } else {
            // Buffer `base` is multiplied while the other fills: the barrier at the end of a
            // step orders both the fill before the next step's reads and this step's reads
            // before the fill after next.
            fetch(w, "0u");
            stash(w, "");
            let _ = writeln!(w, "    workgroupBarrier();");
            let _ = writeln!(w, "    var base = 0u;");
            let _ = writeln!(w, "    for (var k0 = 0u; k0 < info.k; k0 = k0 + {depth}u) {{");
            let _ = writeln!(w, "        let more = k0 + {depth}u < info.k;");
            let _ = writeln!(w, "        if (more) {{");
            fetch(w, &format!("k0 + {depth}u"));
            let _ = writeln!(w, "        }}");
            multiply(w, "base + ");
            let _ = writeln!(w, "        base = {}u - base;", self.quads());
            let _ = writeln!(w, "        if (more) {{");
            stash(w, "base + ");
            let _ = writeln!(w, "        }}");
            let _ = writeln!(w, "        workgroupBarrier();");
            let _ = writeln!(w, "    }}");
        }
        for r in 0..rows {
            let _ = writeln!(w, "    let out_row{r} = row0 + {}u + lid.y * 4u;", (r / 4) * 64 + r % 4);
            let _ = writeln!(w, "    if (out_row{r} < info.m) {{");
            for h in 0..groups {
                let _ = writeln!(w, "        store_quad(co, out_row{r}, col0 + {}u + lid.x * 4u, acc{r}_{h});", h * 64);
            }
            let _ = writeln!(w, "    }}");
        }
        s
    }
}

/// A matmul body written out for its tile: the placeholders it fills in its shader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum MatmulBody {
    Register(RegisterTile),
    Staged(StagedTile),
}

impl MatmulBody {
    pub fn placeholders(&self) -> Vec<(&'static str, std::borrow::Cow<'static, str>)> {
        match self {
            MatmulBody::Register(tile) => vec![("BODY", tile.body().into()), ("TM", tile.rows.to_string().into()), ("TN", tile.cols.to_string().into())],
            MatmulBody::Staged(tile) => vec![("BODY", tile.body().into()), ("TILE_QUADS", (tile.quads() * tile.buffers).to_string().into())],
        }
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
                .with_body(MatmulBody::Register(tile));
            let [x, y] = tile.groups(m, n);
            (kernel, [x, y, batches as u32])
        }
        MatmulKernel::Staged(tile) => {
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
                .with("LOAD_B", load_b)
                .with_body(MatmulBody::Staged(tile));
            let groups = |d: usize| (d as u32).div_ceil(tile.tile);
            (kernel, [groups(n), groups(m), batches as u32])
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
    /// Blocks of C staged in workgroup memory (see [`StagedTile`]), 16 x 16 invocations each
    /// computing (tile / 16)^2 outputs in registers: each element read from global memory once
    /// per workgroup.
    Staged(StagedTile),
}

/// The staged kernels. On an H100 (Vulkan) two buffers of 8 steps lead from 2,048 (32.0 TFLOP/s
/// at 2,048 against 28.6 with one buffer and 29.3 with one of 16 steps), 64-wide blocks at 1,024
/// (20.6: 128-wide ones leave most of the GPU idle there); 128-wide blocks 16 steps deep in two
/// buffers (32 KiB) ran at 21-22, too few workgroups fitting beside each other.
const STAGED: [StagedTile; 4] = [
    StagedTile { tile: 128, depth: 8, buffers: 1 },
    StagedTile { tile: 128, depth: 8, buffers: 2 },
    StagedTile { tile: 128, depth: 16, buffers: 1 },
    StagedTile { tile: 64, depth: 16, buffers: 2 },
];

impl MatmulKernel {
    /// Every variant (the tests check each against the CPU reference).
    pub const ALL: [MatmulKernel; 10] = [
        MatmulKernel::Naive,
        MatmulKernel::Tiled,
        MatmulKernel::Blocked,
        MatmulKernel::Staged(STAGED[0]),
        MatmulKernel::Staged(STAGED[1]),
        MatmulKernel::Staged(STAGED[2]),
        MatmulKernel::Staged(STAGED[3]),
        MatmulKernel::Register { rows: 8, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 4 },
    ];

    /// The variants measured at first use of a class of shapes: those that led somewhere
    /// (register kernels on CPU adapters and small products, staged ones on GPUs). The naive,
    /// tiled and blocked kernels never won, and one buffer of 8 steps always lost to two; measuring
    /// them would make first calls slow.
    pub const CANDIDATES: [MatmulKernel; 6] = [
        MatmulKernel::Register { rows: 8, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 8 },
        MatmulKernel::Register { rows: 4, cols: 4 },
        MatmulKernel::Staged(STAGED[1]),
        MatmulKernel::Staged(STAGED[2]),
        MatmulKernel::Staged(STAGED[3]),
    ];

    /// Workgroup memory the kernel declares: an adapter whose limit is lower cannot run it.
    pub fn workgroup_bytes(self) -> u32 {
        match self {
            MatmulKernel::Naive | MatmulKernel::Register { .. } => 0,
            // Two 16 x 16 tiles of the accumulator type (matmul.wgsl).
            MatmulKernel::Tiled => 2 * 16 * 16 * 4,
            // Two 64 x 16 stages (matmul.wgsl).
            MatmulKernel::Blocked => 2 * 64 * 16 * 4,
            MatmulKernel::Staged(tile) => tile.workgroup_bytes(),
        }
    }

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
            MatmulKernel::Staged(_) => "staged",
            MatmulKernel::Register { .. } => "registers",
        }
    }

    /// A short name: naive, tiled, blocked, register8x8, staged128k16 (128-wide blocks, 16 steps
    /// of k deep), staged128k8db (two buffers).
    pub fn name(self) -> String {
        match self {
            MatmulKernel::Register { rows, cols } => format!("register{rows}x{cols}"),
            MatmulKernel::Staged(StagedTile { tile, depth, buffers }) => format!("staged{tile}k{depth}{}", if buffers == 2 { "db" } else { "" }),
            other => other.entry().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_a_name_of_its_own_and_fits_the_workgroup_memory_webgpu_guarantees() {
        for kind in MatmulKernel::ALL {
            assert_eq!(MatmulKernel::from_name(&kind.name()), Some(kind));
            // 16 KiB: every WebGPU adapter, so every variant runs in every browser.
            assert!(kind.workgroup_bytes() <= 16384, "{}: {} bytes", kind.name(), kind.workgroup_bytes());
        }
        assert!(MatmulKernel::CANDIDATES.iter().all(|c| MatmulKernel::ALL.contains(c)));
        let double = StagedTile { tile: 128, depth: 8, buffers: 2 };
        assert_eq!(MatmulKernel::Staged(double).name(), "staged128k8db");
        // A's and B's 128 x 8 blocks, twice: 2 x 2 x 128 x 8 x 4 bytes.
        assert_eq!(double.workgroup_bytes(), 16384);
    }

    #[test]
    fn a_staged_body_stages_every_element_once_and_waits_once_a_step_with_two_buffers() {
        for (tile, buffers) in [(StagedTile { tile: 128, depth: 16, buffers: 1 }, 1), (StagedTile { tile: 128, depth: 8, buffers: 2 }, 2)] {
            let body = tile.body();
            // 128 x depth elements of A, as many of B, over 256 invocations: quads each.
            let quads = (tile.tile * tile.depth / 4 / 256) as usize;
            assert_eq!(body.matches("= quad_a(").count(), quads * buffers, "{tile:?}: the first fetch and the loop's");
            // In the loop over k: a wait after staging and one before restaging, or with two
            // buffers one wait for both.
            let per_step = body[body.find("for (var k0").unwrap()..].matches("workgroupBarrier()").count();
            assert_eq!(per_step, 3 - buffers, "{tile:?}");
            // 8 x 8 outputs per invocation, depth steps of k: 16 vec4 fma a step.
            assert_eq!(body.matches("fma(").count(), 16 * tile.depth as usize, "{tile:?}");
        }
    }
}
