// Batched matrix multiply C[b] = A[b] @ B[b] through workgroup memory: a workgroup of 16 x 16
// invocations computes a TILE x TILE block of C, each invocation (TILE / 16)^2 of it in vec4
// accumulators. DEPTH steps of k at a time, the workgroup stages A's TILE rows and B's TILE
// columns for them in workgroup memory (each element read from global memory once per
// workgroup, where the register kernel counts on caches), then every invocation multiplies
// from there. With two buffers, the next steps' loads are in flight while the current ones are
// multiplied, and one barrier per step suffices. The body (BODY) is straight-line code that
// src/kernels/matmul.rs writes for the tile (`StagedTile`).
// Specialised: LOAD_A and LOAD_B read four elements into v (one 128-bit load where the operand's
// rows allow it, else four strided loads). info: MatmulMeta (src/kernels/meta.rs).
{{ENABLE}}

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x (and load4_x) for the operands c, a, b.
{{BUFFERS}}

// A's block transposed, [buffer][k][row / 4], and B's block, [buffer][k][column / 4].
var<workgroup> tile_a: array<vec4<f32>, {{TILE_QUADS}}>;
var<workgroup> tile_b: array<vec4<f32>, {{TILE_QUADS}}>;

// Four steps of k from kq along row r of A (r already within m); steps past k are zeros.
fn quad_a(ao: u32, r: u32, kq: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    {{LOAD_A}}
    return v;
}

// Four columns from c of row kr of B; rows past k are zeros, columns past n repeat the last.
fn quad_b(bo: u32, kr: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (kr < info.k) {
        {{LOAD_B}}
    }
    return v;
}

// Row `row` of the invocation's block: four columns from c.
fn store_quad(co: u32, row: u32, c: u32, v: vec4<f32>) {
    let cr = co + row * info.c.row_stride;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (c + j < info.n) { store_c(cr + (c + j) * info.c.col_stride, c_t(v[j])); }
    }
}

@compute @workgroup_size(16, 16)
fn staged(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    // The grid has exactly info.batches layers: no invocation leaves before the barriers.
    let batch = wid.z;
    let ao = info.a.offset + batch * info.a.batch_stride;
    let bo = info.b.offset + batch * info.b.batch_stride;
    let co = info.c.offset + batch * info.c.batch_stride;
    let t = lid.y * 16u + lid.x;
{{BODY}}
}
