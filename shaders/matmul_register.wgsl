// Batched matrix multiply C[b] = A[b] @ B[b] with register blocking and no workgroup memory:
// each invocation computes a TM x TN block of C in vec4 accumulators, in straight-line code
// that src/kernels/matmul.rs generates (BODY) for its tile size and for whether A's and B's rows
// load 128 bits at a time. Caches, not workgroup memory, share loads between invocations, which
// is what CPU drivers (and many GPUs) do best; the device measures it against `blocked`.
// info: MatmulMeta (src/kernels/meta.rs).
{{ENABLE}}

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x (and load4_x) for the operands c, a, b.
{{BUFFERS}}

@compute @workgroup_size(8, 8)
fn registers(@builtin(global_invocation_id) gid: vec3<u32>) {
    let batch = gid.z;
    let m = info.m; let n = info.n; let k = info.k;
    let row0 = gid.y * {{TM}}u;
    let col0 = gid.x * {{TN}}u;
    if (row0 >= m || col0 >= n || batch >= info.batches) { return; }
    let ao = info.a.offset + batch * info.a.batch_stride;
    let bo = info.b.offset + batch * info.b.batch_stride;
    let co = info.c.offset + batch * info.c.batch_stride;
    let ars = info.a.row_stride; let acs = info.a.col_stride;
    let brs = info.b.row_stride; let bcs = info.b.col_stride;
{{BODY}}
}
