// Kernels that walk one dimension per invocation ("rows"): softmax, log_softmax, layer_norm,
// var and argmax. Strided input; the walked dimension may be any.
// info: [0] rows, [1] ndim, [2..10] row shape (the walked dim has size 1),
//       [10] out offset, [11..19] out strides, [19] a offset, [20..28] a strides,
//       [28] walked dim, [29] its length, [30] a float parameter (eps, correction) as bits,
//       [31] weight offset, [32] weight stride, [33] bias offset, [34] bias stride,
//       [35] mean offset, [36] rstd offset (layer_norm's saved statistics, contiguous).
// Specialised: {{ENABLE}}, BUFFERS (load_x / store_x and the value type x_t for out, a, w, b,
// mean and rstd; entries that do not use some get stand-ins, since every entry compiles).
{{ENABLE}}

{{COMMON}}
{{BUFFERS}}

fn row(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// Where row r starts in the input (a0) and output (o0), their strides along the walked
// dimension (sa, so) and its length n.
struct Walk { a0: u32, sa: u32, o0: u32, so: u32, n: u32 }

fn walk(r: u32) -> Walk {
    let d = info[28];
    return Walk(offset_of(r, 19u), info[20u + d], offset_of(r, 10u), info[11u + d], info[29]);
}

struct Stats { m: f32, sum: f32 }

// Running max and sum of exp(x - max) over the row (one pass, rescaling as the max grows).
fn softmax_stats(a0: u32, sa: u32, n: u32) -> Stats {
    var m = bitcast<f32>(0xff7fffffu); // -FLT_MAX (a decimal literal may round past it)
    var sum = 0.0;
    for (var k = 0u; k < n; k = k + 1u) {
        let x = f32(load_a(a0 + k * sa));
        if (x > m) {
            sum = sum * exp(m - x);
            m = x;
        }
        sum = sum + exp(x - m);
    }
    return Stats(m, sum);
}

@compute @workgroup_size(64)
fn softmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info[0]) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let st = softmax_stats(a0, sa, n);
    for (var k = 0u; k < n; k = k + 1u) {
        store_out(o0 + k * so, {{T}}(exp(f32(load_a(a0 + k * sa)) - st.m) / st.sum));
    }
}

@compute @workgroup_size(64)
fn log_softmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info[0]) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let st = softmax_stats(a0, sa, n);
    let shift = st.m + log(st.sum);
    for (var k = 0u; k < n; k = k + 1u) {
        store_out(o0 + k * so, {{T}}(f32(load_a(a0 + k * sa)) - shift));
    }
}

// Mean and variance of the row (two passes, for accuracy).
fn moments(a0: u32, sa: u32, n: u32) -> vec2<f32> {
    var sum = 0.0;
    for (var k = 0u; k < n; k = k + 1u) { sum = sum + f32(load_a(a0 + k * sa)); }
    let mean = sum / f32(n);
    var sq = 0.0;
    for (var k = 0u; k < n; k = k + 1u) {
        let dx = f32(load_a(a0 + k * sa)) - mean;
        sq = sq + dx * dx;
    }
    return vec2<f32>(mean, sq);
}

// layer_norm over the walked (last) dimension, with weight and bias; saves mean and 1/std per
// row as PyTorch's native_layer_norm does.
@compute @workgroup_size(64)
fn layer_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info[0]) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let mo = moments(a0, sa, n);
    let rstd = inverseSqrt(mo.y / f32(n) + bitcast<f32>(info[30]));
    store_mean(info[35] + r, mean_t(mo.x));
    store_rstd(info[36] + r, rstd_t(rstd));
    for (var k = 0u; k < n; k = k + 1u) {
        let w = f32(load_w(info[31] + k * info[32]));
        let b = f32(load_b(info[33] + k * info[34]));
        store_out(o0 + k * so, {{T}}((f32(load_a(a0 + k * sa)) - mo.x) * rstd * w + b));
    }
}

// var with a correction (1: unbiased, PyTorch's default); out has the reduced layout.
@compute @workgroup_size(64)
fn variance(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info[0]) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let n = w.n;
    let mo = moments(a0, sa, n);
    store_out(offset_of(r, 10u), {{T}}(mo.y / max(f32(n) - bitcast<f32>(info[30]), 0.0)));
}

// argmax: index of the first maximum (NaN counts as the maximum, as in PyTorch).
@compute @workgroup_size(64)
fn argmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info[0]) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let n = w.n;
    var best = 0u;
    var m = f32(load_a(a0));
    for (var k = 1u; k < n; k = k + 1u) {
        let x = f32(load_a(a0 + k * sa));
        if (x > m || (x != x && m == m)) { m = x; best = k; }
    }
    store_out(offset_of(r, 10u), {{T}}(best));
}
