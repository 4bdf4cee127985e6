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

// Folds the reduced elements first, first + stride, ... below end into acc, four loads issued
// before their four steps: a loop of one load then one step waits a memory latency per element,
// and a GPU reaches its bandwidth only with several loads in flight per invocation.
fn fold(start: {{ACC}}, base: u32, first: u32, end: u32, stride: u32) -> {{ACC}} {
    var acc = start;
    var k = first;
    // k + 3 * stride < end, written so that it cannot wrap.
    let last_quad = select(0u, end - 3u * stride, end > 3u * stride);
    for (; k < last_quad; k = k + 4u * stride) {
        let x0 = load_a(reduced_offset(k, base));
        let x1 = load_a(reduced_offset(k + stride, base));
        let x2 = load_a(reduced_offset(k + 2u * stride, base));
        let x3 = load_a(reduced_offset(k + 3u * stride, base));
        { let x = x0; {{STEP}} }
        { let x = x1; {{STEP}} }
        { let x = x2; {{STEP}} }
        { let x = x3; {{STEP}} }
    }
    for (; k < end; k = k + stride) {
        let x = load_a(reduced_offset(k, base));
        {{STEP}}
    }
    return acc;
}

var<workgroup> partial: array<{{ACC}}, 256>;

// Combines the accumulators of each run of {{LANES}} invocations (a power of two dividing 256)
// in a tree; every invocation gets its run's result. Call it from uniform control flow (it has
// barriers; the loop's bound is a constant, so every invocation meets the same ones).
fn combine_lanes(lid: u32, mine: {{ACC}}) -> {{ACC}} {
    partial[lid] = mine;
    workgroupBarrier();
    let lane = lid % {{LANES}}u;
    for (var span = {{LANES}}u / 2u; span > 0u; span = span >> 1u) {
        if (lane < span) {
            var acc = partial[lid];
            let x = partial[lid + span];
            {{COMBINE}}
            partial[lid] = acc;
        }
        workgroupBarrier();
    }
    return partial[lid - lane];
}
