// A long reduction split over info.parts workgroups per output element, in two passes that
// keep their partial accumulators in `part`: the global-memory buffer PyTorch's split
// reduction allocates (src/tensor/ops/cuda_reduce.rs), so the memory the trace shows is the
// memory used. Placeholders as in reduce.wgsl ({{LANES}} is 256: a workgroup per part).
{{ENABLE}}

{{COMMON}}
{{INDEXING}}
// BUFFERS declares the bindings and load_x / store_x for the operands out, a and part.
{{BUFFERS}}
{{REDUCTION}}

// Pass 1: workgroup p of output i takes the p-th of info.parts runs of the reduced elements
// (ceil(n / parts) long, the last shorter; neighbouring invocations read neighbouring elements,
// and each workgroup streams one range, which CPU adapters' caches need too) and keeps its
// accumulator at part[i * parts + p]. The run's end, at most n + run, cannot wrap: a binding
// holds far fewer than 2^31 elements.
@compute @workgroup_size(256)
fn reduce_split(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let w = wid.x + wid.y * nwg.x;
    let i = w / info.parts;
    let p = w % info.parts;
    let in_range = i < info.numel;
    let n = info.count;
    var acc: {{ACC}} = {{INIT}};
    if (in_range) {
        let base = offset_of(i, info.a);
        let run = n / info.parts + select(0u, 1u, n % info.parts != 0u);
        acc = fold(acc, base, p * run + lid.x, min(p * run + run, n), 256u);
    }
    acc = combine_lanes(lid.x, acc);
    if (in_range && lid.x == 0u) {
        store_part(info.part + i * info.parts + p, acc);
    }
}

// Pass 2: a workgroup per output element combines its parts and writes the result.
@compute @workgroup_size(256)
fn reduce_parts(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = wid.x + wid.y * nwg.x;
    let in_range = i < info.numel;
    let n = info.count;
    var acc: {{ACC}} = {{INIT}};
    if (in_range) {
        for (var j = lid.x; j < info.parts; j = j + 256u) {
            let x = load_part(info.part + i * info.parts + j);
            {{COMBINE}}
        }
    }
    acc = combine_lanes(lid.x, acc);
    if (in_range && lid.x == 0u) {
        store_out(offset_of(i, info.out), {{FINISH}});
    }
}
