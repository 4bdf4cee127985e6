// Batched matrix multiply C[b] = A[b] @ B[b] through workgroup memory: a workgroup of 16 x 16
// invocations computes a 128 x 128 block of C, each invocation 8 x 8 of it in vec4 accumulators.
// Eight steps of k at a time, the workgroup first stages A's 128 rows and B's 128 columns for
// them in workgroup memory (each element read from global memory once per workgroup, where the
// register kernel counts on caches), then every invocation multiplies from there. An
// invocation's rows are four at ty * 4 and four at 64 + ty * 4, its columns likewise, so that
// neighbouring invocations read neighbouring vec4s of the staged blocks.
// Specialised: LOAD_A and LOAD_B read four elements into v (one 128-bit load where the operand's
// rows allow it, else four strided loads). info: MatmulMeta (src/kernels/meta.rs).
{{ENABLE}}

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x (and load4_x) for the operands c, a, b.
{{BUFFERS}}

const BK: u32 = 8u;
// A's block transposed, [k][row / 4], and B's block, [k][column / 4]: 8 x 128 floats each.
var<workgroup> tile_a: array<vec4<f32>, 256>;
var<workgroup> tile_b: array<vec4<f32>, 256>;

// Invocation t stages row t / 2 of A's block, four steps of k from (t % 2) * 4. Rows past m
// repeat the last (their sums are never stored); steps past k are zeros.
fn stage_a(t: u32, ao: u32, row0: u32, k0: u32) {
    let row = t / 2u;
    let kq = k0 + (t % 2u) * 4u;
    let r = min(row0 + row, info.m - 1u);
    var v = vec4<f32>(0.0);
    {{LOAD_A}}
    for (var j = 0u; j < 4u; j = j + 1u) {
        tile_a[((t % 2u) * 4u + j) * 32u + row / 4u][row % 4u] = v[j];
    }
}

// Invocation t stages four columns of row t / 32 of B's block, from (t % 32) * 4. Rows past k
// are zeros; columns past n repeat the last.
fn stage_b(t: u32, bo: u32, col0: u32, k0: u32) {
    let kr = k0 + t / 32u;
    let c = col0 + (t % 32u) * 4u;
    var v = vec4<f32>(0.0);
    if (kr < info.k) {
        {{LOAD_B}}
    }
    tile_b[t] = v;
}

// Row `row` of the invocation's block: four columns from c_lo (lo) and four from c_hi (hi).
fn store_row(co: u32, row: u32, c_lo: u32, c_hi: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (row >= info.m) { return; }
    let cr = co + row * info.c.row_stride;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (c_lo + j < info.n) { store_c(cr + (c_lo + j) * info.c.col_stride, c_t(lo[j])); }
        if (c_hi + j < info.n) { store_c(cr + (c_hi + j) * info.c.col_stride, c_t(hi[j])); }
    }
}

@compute @workgroup_size(16, 16)
fn staged(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // The grid has exactly info.batches layers: no invocation leaves before the barriers.
    let batch = wid.z;
    let ao = info.a.offset + batch * info.a.batch_stride;
    let bo = info.b.offset + batch * info.b.batch_stride;
    let co = info.c.offset + batch * info.c.batch_stride;
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let t = lid.y * 16u + lid.x;
    // acc{r}_{h}: row r of the invocation's eight (0-3 at ty * 4, 4-7 at 64 + ty * 4), columns
    // tx * 4.. (h = 0) and 64 + tx * 4.. (h = 1).
    var acc0_0 = vec4<f32>(0.0); var acc0_1 = vec4<f32>(0.0);
    var acc1_0 = vec4<f32>(0.0); var acc1_1 = vec4<f32>(0.0);
    var acc2_0 = vec4<f32>(0.0); var acc2_1 = vec4<f32>(0.0);
    var acc3_0 = vec4<f32>(0.0); var acc3_1 = vec4<f32>(0.0);
    var acc4_0 = vec4<f32>(0.0); var acc4_1 = vec4<f32>(0.0);
    var acc5_0 = vec4<f32>(0.0); var acc5_1 = vec4<f32>(0.0);
    var acc6_0 = vec4<f32>(0.0); var acc6_1 = vec4<f32>(0.0);
    var acc7_0 = vec4<f32>(0.0); var acc7_1 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < info.k; k0 = k0 + BK) {
        stage_a(t, ao, row0, k0);
        stage_b(t, bo, col0, k0);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let a_lo = tile_a[kk * 32u + lid.y];
            let a_hi = tile_a[kk * 32u + 16u + lid.y];
            let b_lo = tile_b[kk * 32u + lid.x];
            let b_hi = tile_b[kk * 32u + 16u + lid.x];
            acc0_0 = fma(vec4<f32>(a_lo[0]), b_lo, acc0_0); acc0_1 = fma(vec4<f32>(a_lo[0]), b_hi, acc0_1);
            acc1_0 = fma(vec4<f32>(a_lo[1]), b_lo, acc1_0); acc1_1 = fma(vec4<f32>(a_lo[1]), b_hi, acc1_1);
            acc2_0 = fma(vec4<f32>(a_lo[2]), b_lo, acc2_0); acc2_1 = fma(vec4<f32>(a_lo[2]), b_hi, acc2_1);
            acc3_0 = fma(vec4<f32>(a_lo[3]), b_lo, acc3_0); acc3_1 = fma(vec4<f32>(a_lo[3]), b_hi, acc3_1);
            acc4_0 = fma(vec4<f32>(a_hi[0]), b_lo, acc4_0); acc4_1 = fma(vec4<f32>(a_hi[0]), b_hi, acc4_1);
            acc5_0 = fma(vec4<f32>(a_hi[1]), b_lo, acc5_0); acc5_1 = fma(vec4<f32>(a_hi[1]), b_hi, acc5_1);
            acc6_0 = fma(vec4<f32>(a_hi[2]), b_lo, acc6_0); acc6_1 = fma(vec4<f32>(a_hi[2]), b_hi, acc6_1);
            acc7_0 = fma(vec4<f32>(a_hi[3]), b_lo, acc7_0); acc7_1 = fma(vec4<f32>(a_hi[3]), b_hi, acc7_1);
        }
        workgroupBarrier();
    }
    let r_lo = row0 + lid.y * 4u;
    let r_hi = row0 + 64u + lid.y * 4u;
    let c_lo = col0 + lid.x * 4u;
    let c_hi = col0 + 64u + lid.x * 4u;
    store_row(co, r_lo, c_lo, c_hi, acc0_0, acc0_1);
    store_row(co, r_lo + 1u, c_lo, c_hi, acc1_0, acc1_1);
    store_row(co, r_lo + 2u, c_lo, c_hi, acc2_0, acc2_1);
    store_row(co, r_lo + 3u, c_lo, c_hi, acc3_0, acc3_1);
    store_row(co, r_hi, c_lo, c_hi, acc4_0, acc4_1);
    store_row(co, r_hi + 1u, c_lo, c_hi, acc5_0, acc5_1);
    store_row(co, r_hi + 2u, c_lo, c_hi, acc6_0, acc6_1);
    store_row(co, r_hi + 3u, c_lo, c_hi, acc7_0, acc7_1);
}
