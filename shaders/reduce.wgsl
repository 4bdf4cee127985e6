// Reductions over any set of dimensions, with strided input, in one pass. Specialised:
// {{ENABLE}}, {{T}} element type, {{ACC}} accumulator type, {{INIT}} its start value, {{STEP}}
// folding element x into acc, {{COMBINE}} folding another accumulator x into acc, {{FINISH}} the
// output from acc (and n, the count).
// info: ReduceMeta (src/kernels/meta.rs): the output's shape (reduced dimensions of size 1),
// and the reduced dimensions' sizes and input strides (the first info.reduced of each).
{{ENABLE}}

{{COMMON}}
{{INDEXING}}
// BUFFERS declares the bindings and load_x / store_x for the operands out and a.
{{BUFFERS}}
{{REDUCTION}}

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
// combine their accumulators. For long reductions, which one invocation would walk alone,
// slowly (and past the loop limits of CPU drivers); the longest are split over several
// workgroups per output instead (reduce_split.wgsl).
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
    acc = combine_workgroup(lid.x, acc);
    if (in_range && lid.x == 0u) {
        store_out(offset_of(i, info.out), {{FINISH}});
    }
}
