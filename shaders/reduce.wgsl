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

// {{LANES}} invocations per output element, 256 / {{LANES}} outputs per workgroup: each
// invocation takes every {{LANES}}-th reduced element, so when they are one contiguous run,
// neighbouring invocations read neighbouring elements (the loads a GPU coalesces), then the run's
// invocations combine their accumulators. With 256 lanes: the long reductions, which one
// invocation would walk alone, slowly (and past the loop limits of CPU drivers); the longest
// are split over several workgroups per output instead (reduce_split.wgsl).
@compute @workgroup_size(256)
fn reduce_lanes(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.x + wid.y * nwg.x) * (256u / {{LANES}}u) + lid.x / {{LANES}}u;
    // No early return: every invocation reaches the barriers.
    let in_range = i < info.numel;
    let n = info.count;
    var acc: {{ACC}} = {{INIT}};
    if (in_range) {
        acc = fold(acc, offset_of(i, info.a), lid.x % {{LANES}}u, n, {{LANES}}u);
    }
    acc = combine_lanes(lid.x, acc);
    if (in_range && lid.x % {{LANES}}u == 0u) {
        store_out(offset_of(i, info.out), {{FINISH}});
    }
}
