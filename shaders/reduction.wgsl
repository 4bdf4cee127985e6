// Shared by the reduction kernels (reduce.wgsl, reduce_split.wgsl), where they say REDUCTION.

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

var<workgroup> partial: array<{{ACC}}, 256>;

// Combines the accumulators of a workgroup's 256 invocations in a tree; every invocation gets
// the result. Call it from uniform control flow (it has barriers).
fn combine_workgroup(lid: u32, mine: {{ACC}}) -> {{ACC}} {
    partial[lid] = mine;
    workgroupBarrier();
    for (var span = 128u; span > 0u; span = span >> 1u) {
        if (lid < span) {
            var acc = partial[lid];
            let x = partial[lid + span];
            {{COMBINE}}
            partial[lid] = acc;
        }
        workgroupBarrier();
    }
    return partial[0];
}
