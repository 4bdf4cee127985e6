// Reductions over any set of dimensions, with strided input, in one pass: one invocation per
// output element loops over the reduced elements. Specialised: {{ENABLE}}, {{T}} element type,
// {{ACC}} accumulator type, {{INIT}} its start value, {{STEP}} folding element x into acc,
// {{COMBINE}} folding another accumulator x into acc, {{FINISH}} the output from acc (and n,
// the count).
// info: ReduceMeta (src/kernels/meta.rs): the output's shape (reduced dimensions of size 1),
// and the reduced dimensions' sizes and input strides (the first info.reduced of each).
{{ENABLE}}

{{COMMON}}
{{INDEXING}}
// BUFFERS declares the bindings and load_x / store_x for the operands out and a.
{{BUFFERS}}

// The reduced elements' offset of index k (row-major over the reduced dimensions' sizes).
// {{CONTIGUOUS}} is true when they are one run of consecutive elements: no index arithmetic.
fn reduced_offset(k: u32, base: u32) -> u32 {
    if ({{CONTIGUOUS}}) { return base + k; }
    var rem = k;
    var off = base;
    for (var d = i32(info.reduced) - 1; d >= 0; d = d - 1) {
        let size = info.sizes[u32(d)];
        off = off + (rem % size) * info.strides[u32(d)];
        rem = rem / size;
    }
    return off;
}

// One invocation per output element: for short reductions over many outputs.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= info.numel) { return; }
    let base = offset_of(i, info.a);
    let n = info.count;
    var acc: {{ACC}} = {{INIT}};
    for (var k = 0u; k < n; k = k + 1u) {
        let x = load_a(reduced_offset(k, base));
        {{STEP}}
    }
    store_out(offset_of(i, info.out), {{FINISH}});
}

// One workgroup per output element: its 256 invocations take every 256th reduced element, then
// combine their accumulators in a tree. For long reductions (a whole tensor's sum), which one
// invocation would walk alone, slowly (and past the loop limits of CPU drivers).
var<workgroup> partial: array<{{ACC}}, 256>;

@compute @workgroup_size(256)
fn reduce_wide(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = wid.x + wid.y * nwg.x;
    // No early return: every invocation reaches the barriers.
    let in_range = i < info.numel;
    let n = info.count;
    var acc: {{ACC}} = {{INIT}};
    if (in_range) {
        let base = offset_of(i, info.a);
        for (var k = lid.x; k < n; k = k + 256u) {
            let x = load_a(reduced_offset(k, base));
            {{STEP}}
        }
    }
    partial[lid.x] = acc;
    workgroupBarrier();
    for (var span = 128u; span > 0u; span = span >> 1u) {
        if (lid.x < span) {
            acc = partial[lid.x];
            let x = partial[lid.x + span];
            {{COMBINE}}
            partial[lid.x] = acc;
        }
        workgroupBarrier();
    }
    if (in_range && lid.x == 0u) {
        acc = partial[0];
        store_out(offset_of(i, info.out), {{FINISH}});
    }
}
