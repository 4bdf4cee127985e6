// Reductions over one dimension, with strided input. One invocation per output element loops
// over the reduced dimension. Specialised: {{ENABLE}}, {{T}} element type, {{ACC}} accumulator type,
// {{INIT}} its start value, {{STEP}} combining acc with x (and k, the index), {{FINISH}} the
// output from acc (and n, the length).
// info: [0] output numel, [1] ndim, [2..10] output shape (reduced dim has size 1),
//       [10] out offset, [11..19] out strides, [19] input offset, [20..28] input strides,
//       [28] reduced dim, [29] its length.
{{ENABLE}}

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x for the operands out and a.
{{BUFFERS}}

@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= info[0]) { return; }
    let base = offset_of(i, 19u);
    let stride = info[20u + info[28]];
    let n = info[29];
    var acc: {{ACC}} = {{INIT}};
    for (var k = 0u; k < n; k = k + 1u) {
        let x = load_a(base + k * stride);
        {{STEP}}
    }
    store_out(offset_of(i, 10u), {{FINISH}});
}
