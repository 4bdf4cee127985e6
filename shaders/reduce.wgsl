// Reductions over any set of dimensions, with strided input, in one pass: one invocation per
// output element loops over the reduced elements. Specialised: {{ENABLE}}, {{T}} element type,
// {{ACC}} accumulator type, {{INIT}} its start value, {{STEP}} combining acc with x (and k, the
// index), {{FINISH}} the output from acc (and n, the count).
// info: [0] output numel, [1] ndim, [2..10] output shape (reduced dims have size 1),
//       [10] out offset, [11..19] out strides, [19] input offset, [20..28] input strides,
//       [28] number of reduced dims r, [29] their element count n, [30..38] their sizes,
//       [38..46] their input strides (the first r of each are used).
{{ENABLE}}

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x for the operands out and a.
{{BUFFERS}}

// The reduced elements' offset of index k (row-major over the reduced dimensions' sizes).
fn reduced_offset(k: u32, base: u32) -> u32 {
    var rem = k;
    var off = base;
    for (var d = i32(info[28]) - 1; d >= 0; d = d - 1) {
        let size = info[30u + u32(d)];
        off = off + (rem % size) * info[38u + u32(d)];
        rem = rem / size;
    }
    return off;
}

// One invocation per output element: for short reductions over many outputs.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= info[0]) { return; }
    let base = offset_of(i, 19u);
    let n = info[29];
    var acc: {{ACC}} = {{INIT}};
    for (var k = 0u; k < n; k = k + 1u) {
        let x = load_a(reduced_offset(k, base));
        {{STEP}}
    }
    store_out(offset_of(i, 10u), {{FINISH}});
}

// One workgroup per output element: its 256 invocations take every 256th reduced element, then
// combine their accumulators in a tree. For long reductions (a whole tensor's sum), which one
// invocation would walk alone, slowly (and past the loop limits of CPU drivers).
var<workgroup> partial: array<{{ACC}}, 256>;

@compute @workgroup_size(256)
fn reduce_wide(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = wid.x + wid.y * nwg.x;
    // No early return: every invocation reaches the barriers.
    let in_range = i < info[0];
    let n = info[29];
    var acc: {{ACC}} = {{INIT}};
    if (in_range) {
        let base = offset_of(i, 19u);
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
            {{STEP}}
            partial[lid.x] = acc;
        }
        workgroupBarrier();
    }
    if (in_range && lid.x == 0u) {
        acc = partial[0];
        store_out(offset_of(i, 10u), {{FINISH}});
    }
}
