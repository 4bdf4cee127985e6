// Kernels that walk one dimension per invocation ("rows"): softmax, log_softmax, layer_norm,
// var and argmax. Strided input; the walked dimension may be any.
// info: RowsMeta (src/kernels/meta.rs): the row shape (the walked dimension of size 1), the
// walked dimension and its length, a parameter (eps, correction), and layer_norm's weight,
// bias and saved statistics (mean and rstd, contiguous).
// Specialised: {{ENABLE}}, BUFFERS (load_x / store_x and the value type x_t for out, a, w, b,
// mean and rstd; entries that do not use some get stand-ins, since every entry compiles).
{{ENABLE}}

{{COMMON}}
{{INDEXING}}
{{BUFFERS}}

fn row(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// Where row r starts in the input (a0) and output (o0), their strides along the walked
// dimension (sa, so) and its length n.
struct Walk { a0: u32, sa: u32, o0: u32, so: u32, n: u32 }

fn walk(r: u32) -> Walk {
    let d = info.dim;
    return Walk(offset_of(r, info.a), info.a.strides[d], offset_of(r, info.out), info.out.strides[d], info.n);
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
    if (r >= info.rows) { return; }
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
    if (r >= info.rows) { return; }
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
    if (r >= info.rows) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let mo = moments(a0, sa, n);
    let rstd = inverseSqrt(mo.y / f32(n) + info.param);
    store_mean(info.mean_offset + r, mean_t(mo.x));
    store_rstd(info.rstd_offset + r, rstd_t(rstd));
    for (var k = 0u; k < n; k = k + 1u) {
        let w = f32(load_w(info.w_offset + k * info.w_stride));
        let b = f32(load_b(info.b_offset + k * info.b_stride));
        store_out(o0 + k * so, {{T}}((f32(load_a(a0 + k * sa)) - mo.x) * rstd * w + b));
    }
}

// var with a correction (1: unbiased, PyTorch's default); out has the reduced layout.
@compute @workgroup_size(64)
fn variance(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let n = w.n;
    let mo = moments(a0, sa, n);
    store_out(offset_of(r, info.out), {{T}}(mo.y / max(f32(n) - info.param, 0.0)));
}

// The index of the row's first maximum (NaN counts as the maximum, as in PyTorch).
fn first_max(a0: u32, sa: u32, n: u32) -> u32 {
    var best = 0u;
    var m = f32(load_a(a0));
    for (var k = 1u; k < n; k = k + 1u) {
        let x = f32(load_a(a0 + k * sa));
        if (x > m || (x != x && m == m)) { m = x; best = k; }
    }
    return best;
}

// argmax: the index of the first maximum.
@compute @workgroup_size(64)
fn argmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    store_out(offset_of(r, info.out), {{T}}(first_max(w.a0, w.sa, w.n)));
}

// Where row r of the incoming gradient starts, and its stride along the walked dimension.
fn grad_walk(r: u32) -> vec2<u32> {
    return vec2<u32>(offset_of(r, info.g), info.g.strides[info.dim]);
}

// _softmax_backward_data: a is softmax's result y, g the gradient; out = y * (g - sum(g * y)).
@compute @workgroup_size(64)
fn softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let gw = grad_walk(r);
    var dot = 0.0;
    for (var k = 0u; k < n; k = k + 1u) { dot = dot + f32(load_a(a0 + k * sa)) * f32(load_b(gw.x + k * gw.y)); }
    for (var k = 0u; k < n; k = k + 1u) {
        store_out(o0 + k * so, {{T}}(f32(load_a(a0 + k * sa)) * (f32(load_b(gw.x + k * gw.y)) - dot)));
    }
}

// _log_softmax_backward_data: a is log_softmax's result y; out = g - exp(y) * sum(g).
@compute @workgroup_size(64)
fn log_softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let gw = grad_walk(r);
    var sum = 0.0;
    for (var k = 0u; k < n; k = k + 1u) { sum = sum + f32(load_b(gw.x + k * gw.y)); }
    for (var k = 0u; k < n; k = k + 1u) {
        store_out(o0 + k * so, {{T}}(f32(load_b(gw.x + k * gw.y)) - exp(f32(load_a(a0 + k * sa))) * sum));
    }
}

// native_layer_norm_backward's input gradient: a is the input x, w the weight, g the gradient,
// with the saved mean and rstd. With xhat = (x - mean) * rstd and wg = w * g:
// out = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)).
@compute @workgroup_size(64)
fn layer_norm_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let o0 = w.o0; let so = w.so; let n = w.n;
    let gw = grad_walk(r);
    let mean = f32(load_mean(info.mean_offset + r));
    let rstd = f32(load_rstd(info.rstd_offset + r));
    var s1 = 0.0;
    var s2 = 0.0;
    for (var k = 0u; k < n; k = k + 1u) {
        let wg = f32(load_w(info.w_offset + k * info.w_stride)) * f32(load_b(gw.x + k * gw.y));
        s1 = s1 + wg;
        s2 = s2 + wg * (f32(load_a(a0 + k * sa)) - mean) * rstd;
    }
    let m1 = s1 / f32(n);
    let m2 = s2 / f32(n);
    for (var k = 0u; k < n; k = k + 1u) {
        let wg = f32(load_w(info.w_offset + k * info.w_stride)) * f32(load_b(gw.x + k * gw.y));
        let xhat = (f32(load_a(a0 + k * sa)) - mean) * rstd;
        store_out(o0 + k * so, {{T}}(rstd * (wg - m1 - xhat * m2)));
    }
}

// native_layer_norm_backward's weight gradient: a is the input seen as [rows, features] and
// walked along the rows (dimension 0), g likewise; one invocation per feature:
// out[f] = sum over rows m of g[m, f] * (x[m, f] - mean[m]) * rstd[m].
@compute @workgroup_size(64)
fn layer_norm_weight_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let a0 = w.a0; let sa = w.sa; let n = w.n;
    let gw = grad_walk(r);
    var sum = 0.0;
    for (var m = 0u; m < n; m = m + 1u) {
        let xhat = (f32(load_a(a0 + m * sa)) - f32(load_mean(info.mean_offset + m))) * f32(load_rstd(info.rstd_offset + m));
        sum = sum + f32(load_b(gw.x + m * gw.y)) * xhat;
    }
    store_out(offset_of(r, info.out), {{T}}(sum));
}

// max(dim): the first maximum's value into out and its index into the mean slot (int64,
// contiguous over the rows).
@compute @workgroup_size(64)
fn max_dim(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let best = first_max(w.a0, w.sa, w.n);
    store_out(offset_of(r, info.out), {{T}}(load_a(w.a0 + best * w.sa)));
    store_mean(info.mean_offset + r, mean_t(best));
}

// max(dim)'s backward (value_selecting_reduction_backward): a is the gradient expanded along
// the walked dimension; out gets it where the saved index (mean slot) points, zero elsewhere.
@compute @workgroup_size(64)
fn max_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = row(gid, nwg);
    if (r >= info.rows) { return; }
    let w = walk(r);
    let o0 = w.o0; let so = w.so; let n = w.n;
    let picked = u32(load_mean(info.mean_offset + r));
    let g = load_a(w.a0);
    for (var k = 0u; k < n; k = k + 1u) {
        store_out(o0 + k * so, select({{T}}(0), {{T}}(g), k == picked));
    }
}
