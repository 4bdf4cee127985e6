//! The register-blocked matmul's body (`shaders/matmul_register.wgsl`), written out for a tile
//! size: WGSL has no way to keep a loop-indexed array in registers, so each accumulator, row
//! offset and load is its own named value.

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
