// Elementwise kernels over strided, broadcast tensors. Specialised by the kernels layer:
//   {{ENABLE}} "enable f16;" when f16 runs natively; {{T}} the type of values in registers;
//   {{BINARY}} the result from x (a's element) and y (b's element); {{TERNARY}} from x, y, z
//   (c's element) and s; {{UNARY}} from x, s (the
//   scalar) and i (the linear index); {{FILL}} from s. Every entry compiles with the module, so
//   the kernels layer gives the unused ones a trivial expression.
//   {{SCALAR}} how s is read from info[SCALAR_AT].
// info: [0] numel, [1] ndim, [2..10] output shape, then for out, a, b, c: offset and 8 strides,
//       then the scalar's bits, then a random seed.
{{ENABLE}}

const SHAPE: u32 = 2u;
const OUT_AT: u32 = 10u;
const A_AT: u32 = 19u;
const B_AT: u32 = 28u;
const C_AT: u32 = 37u;
const SCALAR_AT: u32 = 46u;
const SEED_AT: u32 = 47u;

{{COMMON}}
// BUFFERS declares the bindings and load_x / store_x for the operands out, a, b, c.
{{BUFFERS}}

// erf to 1.5e-7 (Abramowitz and Stegun 7.1.26): WGSL has no erf, and PyTorch's gelu uses it.
fn erf_approx(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
    return sign(x) * (1.0 - poly * exp(-x * x));
}

// pow with PyTorch's results for negative bases and integer exponents (WGSL's pow is undefined
// for x < 0).
fn pow_signed(x: f32, y: f32) -> f32 {
    if (y == 0.0) { return 1.0; }
    // 0 to a negative power is inf; computed at run time (a constant inf is a shader error).
    if (x == 0.0) { return select(0.0, 1.0 / x, y < 0.0); }
    if (y == round(y)) {
        let r = exp2(y * log2(abs(x)));
        return select(r, -r, x < 0.0 && abs(y % 2.0) == 1.0);
    }
    return exp2(y * log2(x));
}

// A counter-based generator: element i of a call with seed s always gets the same numbers,
// whatever the dispatch shape (a PCG hash, applied twice).
fn pcg(x: u32) -> u32 {
    let state = x * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Uniform in [0, 1) with 24 random bits; `lane` draws independent numbers for one element.
fn uniform(i: u32, lane: u32) -> f32 {
    return f32(pcg(pcg(i * 2u + lane) ^ info[SEED_AT]) >> 8u) * (1.0 / 16777216.0);
}

// Standard normal by Box-Muller.
fn normal(i: u32) -> f32 {
    let u1 = max(uniform(i, 0u), 1.0e-7);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * uniform(i, 1u));
}

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info[0]) { return; }
    let x = load_a(offset_of(i, A_AT));
    let y = load_b(offset_of(i, B_AT));
    store_out(offset_of(i, OUT_AT), {{BINARY}});
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info[0]) { return; }
    let x = load_a(offset_of(i, A_AT));
    let s = {{SCALAR}};
    store_out(offset_of(i, OUT_AT), {{UNARY}});
}

@compute @workgroup_size(256)
fn ternary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info[0]) { return; }
    let x = load_a(offset_of(i, A_AT));
    let y = load_b(offset_of(i, B_AT));
    let z = load_c(offset_of(i, C_AT));
    let s = {{SCALAR}};
    store_out(offset_of(i, OUT_AT), {{TERNARY}});
}

// Writes the scalar everywhere (fill_, zeros, ones, full).
@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info[0]) { return; }
    let s = {{SCALAR}};
    store_out(offset_of(i, OUT_AT), {{FILL}});
}

// index_select along info[SCALAR_AT]: out[.., j, ..] = a[.., b[j], ..]; indices are clamped
// into range (PyTorch raises a device-side assert instead).
@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info[0]) { return; }
    let dim = info[SCALAR_AT];
    var rem = i;
    var src = info[A_AT];
    for (var d = i32(info[1]) - 1; d >= 0; d = d - 1) {
        let n = info[SHAPE + u32(d)];
        var c = rem % n;
        rem = rem / n;
        if (u32(d) == dim) {
            c = u32(clamp(i32(load_b(info[B_AT] + c * info[B_AT + 1u])), 0, i32(info[C_AT]) - 1));
        }
        src = src + c * info[A_AT + 1u + u32(d)];
    }
    store_out(offset_of(i, OUT_AT), out_t(load_a(src)));
}
