// Batched matrix multiply C[b] = A[b] @ B[b] over strided inputs (a batch stride may be 0).
// Specialised: {{ENABLE}}, {{T}} element type, {{ACC}} accumulator type, {{TILE}} tile edge.
// info: MatmulMeta (src/kernels/meta.rs): m, n, k, the batch count, and each matrix's layout.
{{ENABLE}}

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x for the operands c, a, b.
{{BUFFERS}}

// One invocation per output element: the baseline the tiled kernel is measured against.
@compute @workgroup_size(8, 8)
fn naive(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = info.m; let n = info.n; let k = info.k;
    let row = gid.y; let col = gid.x; let batch = gid.z;
    if (row >= m || col >= n || batch >= info.batches) { return; }
    let ao = info.a.offset + batch * info.a.batch_stride + row * info.a.row_stride;
    let bo = info.b.offset + batch * info.b.batch_stride + col * info.b.col_stride;
    var acc: {{ACC}} = {{ACC}}(0);
    for (var i = 0u; i < k; i = i + 1u) {
        acc = acc + {{ACC}}(load_a(ao + i * info.a.col_stride)) * {{ACC}}(load_b(bo + i * info.b.row_stride));
    }
    store_c(info.c.offset + batch * info.c.batch_stride + row * info.c.row_stride + col * info.c.col_stride, {{T}}(acc));
}

const TILE: u32 = {{TILE}}u;
var<workgroup> tile_a: array<array<{{ACC}}, {{TILE}}>, {{TILE}}>;
var<workgroup> tile_b: array<array<{{ACC}}, {{TILE}}>, {{TILE}}>;

// Workgroup tiling: each workgroup stages TILE x TILE blocks of A and B in shared memory, so
// each element is read from global memory once per tile instead of once per product.
@compute @workgroup_size({{TILE}}, {{TILE}})
fn tiled(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let m = info.m; let n = info.n; let k = info.k;
    let row = wid.y * TILE + lid.y;
    let col = wid.x * TILE + lid.x;
    let batch = wid.z;
    let ao = info.a.offset + batch * info.a.batch_stride;
    let bo = info.b.offset + batch * info.b.batch_stride;
    var acc: {{ACC}} = {{ACC}}(0);
    let tiles = (k + TILE - 1u) / TILE;
    for (var t = 0u; t < tiles; t = t + 1u) {
        let ak = t * TILE + lid.x;
        let bk = t * TILE + lid.y;
        var av: {{ACC}} = {{ACC}}(0);
        var bv: {{ACC}} = {{ACC}}(0);
        if (row < m && ak < k) { av = {{ACC}}(load_a(ao + row * info.a.row_stride + ak * info.a.col_stride)); }
        if (col < n && bk < k) { bv = {{ACC}}(load_b(bo + bk * info.b.row_stride + col * info.b.col_stride)); }
        tile_a[lid.y][lid.x] = av;
        tile_b[lid.y][lid.x] = bv;
        workgroupBarrier();
        for (var i = 0u; i < TILE; i = i + 1u) {
            acc = acc + tile_a[lid.y][i] * tile_b[i][lid.x];
        }
        workgroupBarrier();
    }
    if (row < m && col < n) {
        store_c(info.c.offset + batch * info.c.batch_stride + row * info.c.row_stride + col * info.c.col_stride, {{T}}(acc));
    }
}

// Register blocking: a 16x16 workgroup computes a 64x64 tile of C, each invocation a 4x4
// block held in registers, so each value loaded from shared memory feeds four products.
const BT: u32 = 64u;
const BK: u32 = 16u;
var<workgroup> block_a: array<array<{{ACC}}, 64>, 16>; // [k][row]
var<workgroup> block_b: array<array<{{ACC}}, 64>, 16>; // [k][col]

// Adds the staged 64x16 by 16x64 product into this invocation's 4x4 block.
fn multiply_staged(lid: vec3<u32>, acc: ptr<function, array<array<{{ACC}}, 4>, 4>>) {
    for (var kk = 0u; kk < BK; kk = kk + 1u) {
        var a4: array<{{ACC}}, 4>;
        var b4: array<{{ACC}}, 4>;
        for (var r = 0u; r < 4u; r = r + 1u) { a4[r] = block_a[kk][lid.y * 4u + r]; }
        for (var c = 0u; c < 4u; c = c + 1u) { b4[c] = block_b[kk][lid.x * 4u + c]; }
        for (var r = 0u; r < 4u; r = r + 1u) {
            for (var c = 0u; c < 4u; c = c + 1u) { (*acc)[r][c] = (*acc)[r][c] + a4[r] * b4[c]; }
        }
    }
}

// Writes this invocation's 4x4 block of C (inside the matrix).
fn store_block(lid: vec3<u32>, batch: u32, row0: u32, col0: u32, acc: ptr<function, array<array<{{ACC}}, 4>, 4>>) {
    let co = info.c.offset + batch * info.c.batch_stride;
    for (var r = 0u; r < 4u; r = r + 1u) {
        for (var c = 0u; c < 4u; c = c + 1u) {
            let row = row0 + lid.y * 4u + r;
            let col = col0 + lid.x * 4u + c;
            if (row < info.m && col < info.n) { store_c(co + row * info.c.row_stride + col * info.c.col_stride, {{T}}((*acc)[r][c])); }
        }
    }
}

// Stages A's 64x16 and B's 16x64 slices at k0 into workgroup memory: 256 invocations load four
// elements each, one at a time.
fn stage_scalar(flat: u32, ao: u32, bo: u32, row0: u32, col0: u32, k0: u32) {
    let m = info.m; let n = info.n; let k = info.k;
    for (var e = 0u; e < 4u; e = e + 1u) {
        let idx = flat * 4u + e;
        let ar = idx / BK; let ak = idx % BK;
        var av = {{ACC}}(0);
        if (row0 + ar < m && k0 + ak < k) { av = {{ACC}}(load_a(ao + (row0 + ar) * info.a.row_stride + (k0 + ak) * info.a.col_stride)); }
        block_a[ak][ar] = av;
        let bk = idx / BT; let bc = idx % BT;
        var bv = {{ACC}}(0);
        if (k0 + bk < k && col0 + bc < n) { bv = {{ACC}}(load_b(bo + (k0 + bk) * info.b.row_stride + (col0 + bc) * info.b.col_stride)); }
        block_b[bk][bc] = bv;
    }
}

// The same with one four-element load of A and of B per invocation: used when both operands'
// rows are contiguous and start at multiples of 4 elements (K and N multiples of 4), each in a
// binding of its own declared as vec4 (of f32, or of native f16).
fn stage_vec4(flat: u32, ao: u32, bo: u32, row0: u32, col0: u32, k0: u32) {
    let m = info.m; let n = info.n; let k = info.k;
    let ar = flat / 4u; let ak = (flat % 4u) * 4u;
    var av = vec4<f32>(0.0);
    if (row0 + ar < m && k0 + ak < k) { av = load4_a((ao + (row0 + ar) * info.a.row_stride + k0 + ak) / 4u); }
    for (var j = 0u; j < 4u; j = j + 1u) { block_a[ak + j][ar] = {{ACC}}(av[j]); }
    let bk = flat / 16u; let bc = (flat % 16u) * 4u;
    var bv = vec4<f32>(0.0);
    if (k0 + bk < k && col0 + bc < n) { bv = load4_b((bo + (k0 + bk) * info.b.row_stride + col0 + bc) / 4u); }
    for (var j = 0u; j < 4u; j = j + 1u) { block_b[bk][bc + j] = {{ACC}}(bv[j]); }
}

// Register blocking over the staged tiles; STAGE (specialised) is stage_scalar or stage_vec4.
@compute @workgroup_size(16, 16)
fn blocked(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let batch = wid.z;
    let ao = info.a.offset + batch * info.a.batch_stride;
    let bo = info.b.offset + batch * info.b.batch_stride;
    let row0 = wid.y * BT;
    let col0 = wid.x * BT;
    var acc: array<array<{{ACC}}, 4>, 4>;
    for (var r = 0u; r < 4u; r = r + 1u) {
        for (var c = 0u; c < 4u; c = c + 1u) { acc[r][c] = {{ACC}}(0); }
    }
    for (var k0 = 0u; k0 < info.k; k0 = k0 + BK) {
        {{STAGE}}(lid.y * 16u + lid.x, ao, bo, row0, col0, k0);
        workgroupBarrier();
        multiply_staged(lid, &acc);
        workgroupBarrier();
    }
    store_block(lid, batch, row0, col0, &acc);
}
