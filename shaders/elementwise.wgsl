// Elementwise kernels over strided, broadcast tensors. Specialised by the kernels layer:
//   {{ENABLE}} "enable f16;" when f16 runs natively; {{T}} the type of values in registers;
//   {{BINARY}} the result from x (a's element) and y (b's element), both converted to
//   {{PROMOTE}} first (empty: as loaded) when the operands' types differ; {{TERNARY}} from x, y, z
//   (c's element) and s; {{UNARY}} from x, s (the
//   scalar) and i (the linear index); {{FILL}} from s. Every entry compiles with the module, so
//   the kernels layer gives the unused ones a trivial expression.
//   {{SCALAR}} how s is read (from scalar_bits, info.scalar read once; the index kernels, which
//   run no ops, read info.scalar). {{QUADS}} the family the
//   `quads` entry runs. info: ElementwiseMeta (src/kernels/meta.rs).
{{ENABLE}}

{{COMMON}}
{{INDEXING}}
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

// info's scalar and seed, copied once per invocation by every entry that computes ops: loads
// of info between an invocation's stores would be repeated after each (the compiler cannot tell
// info's binding from the outputs' apart).
var<private> scalar_bits: u32;
var<private> seed: u32;

fn read_scalars() {
    scalar_bits = info.scalar;
    seed = info.seed;
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
    return f32(pcg(pcg(i * 2u + lane) ^ seed) >> 8u) * (1.0 / 16777216.0);
}

// Standard normal by Box-Muller.
fn normal(i: u32) -> f32 {
    let u1 = max(uniform(i, 0u), 1.0e-7);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * uniform(i, 1u));
}

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 256u;
}

// Each entry's expression as a function of one element's values and linear index i.
fn binary_op(a_value: a_t, b_value: b_t, i: u32) -> out_t {
    let s = {{SCALAR}};
    let x = {{PROMOTE}}(a_value);
    let y = {{PROMOTE}}(b_value);
    return {{BINARY}};
}

fn unary_op(x: a_t, i: u32) -> out_t {
    let s = {{SCALAR}};
    return {{UNARY}};
}

fn ternary_op(x: a_t, y: b_t, z: c_t, i: u32) -> out_t {
    let s = {{SCALAR}};
    return {{TERNARY}};
}

fn fill_op(i: u32) -> out_t {
    let s = {{SCALAR}};
    return {{FILL}};
}

@compute @workgroup_size(256)
fn binary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    read_scalars();
    store_out(offset_of(i, info.out), binary_op(load_a(offset_of(i, info.a)), load_b(offset_of(i, info.b)), i));
}

@compute @workgroup_size(256)
fn unary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    read_scalars();
    store_out(offset_of(i, info.out), unary_op(load_a(offset_of(i, info.a)), i));
}

@compute @workgroup_size(256)
fn ternary(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    read_scalars();
    store_out(offset_of(i, info.out), ternary_op(load_a(offset_of(i, info.a)), load_b(offset_of(i, info.b)), load_c(offset_of(i, info.c)), i));
}

// Writes the scalar everywhere (fill_, zeros, ones, full), or random numbers.
@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    read_scalars();
    store_out(offset_of(i, info.out), fill_op(i));
}

// The same four over contiguous f32 or native f16 operands (same shape, each starting at a
// multiple of 4 elements), four elements a load and store (vec4 bindings) and no index
// arithmetic: what memory speed needs.
// `{op}_load(q, o)` reads elements 4q..4q+3 of the inputs (o: the operands' offsets in quads,
// out, a, b, c), `{op}_store(q, o, v)` computes and writes them, `{op}_tail(q)` those of them
// that exist.
struct Quads {
    x: vec4<f32>,
    y: vec4<f32>,
    z: vec4<f32>,
}

fn binary_load(q: u32, o: vec4<u32>) -> Quads {
    return Quads(load4_a(o.y + q), load4_b(o.z + q), vec4<f32>());
}

fn binary_store(q: u32, o: vec4<u32>, v: Quads) {
    let i = q * 4u;
    store4_out(o.x + q, vec4<f32>(f32(binary_op(a_t(v.x[0]), b_t(v.y[0]), i)), f32(binary_op(a_t(v.x[1]), b_t(v.y[1]), i + 1u)),
        f32(binary_op(a_t(v.x[2]), b_t(v.y[2]), i + 2u)), f32(binary_op(a_t(v.x[3]), b_t(v.y[3]), i + 3u))));
}

fn binary_tail(q: u32) {
    for (var j = q * 4u; j < info.numel; j = j + 1u) {
        store_out(info.out.offset + j, binary_op(load_a(info.a.offset + j), load_b(info.b.offset + j), j));
    }
}

fn unary_load(q: u32, o: vec4<u32>) -> Quads {
    return Quads(load4_a(o.y + q), vec4<f32>(), vec4<f32>());
}

fn unary_store(q: u32, o: vec4<u32>, v: Quads) {
    let i = q * 4u;
    store4_out(o.x + q, vec4<f32>(f32(unary_op(a_t(v.x[0]), i)), f32(unary_op(a_t(v.x[1]), i + 1u)),
        f32(unary_op(a_t(v.x[2]), i + 2u)), f32(unary_op(a_t(v.x[3]), i + 3u))));
}

fn unary_tail(q: u32) {
    for (var j = q * 4u; j < info.numel; j = j + 1u) {
        store_out(info.out.offset + j, unary_op(load_a(info.a.offset + j), j));
    }
}

fn ternary_load(q: u32, o: vec4<u32>) -> Quads {
    return Quads(load4_a(o.y + q), load4_b(o.z + q), load4_c(o.w + q));
}

fn ternary_store(q: u32, o: vec4<u32>, v: Quads) {
    let i = q * 4u;
    store4_out(o.x + q, vec4<f32>(f32(ternary_op(a_t(v.x[0]), b_t(v.y[0]), c_t(v.z[0]), i)),
        f32(ternary_op(a_t(v.x[1]), b_t(v.y[1]), c_t(v.z[1]), i + 1u)), f32(ternary_op(a_t(v.x[2]), b_t(v.y[2]), c_t(v.z[2]), i + 2u)),
        f32(ternary_op(a_t(v.x[3]), b_t(v.y[3]), c_t(v.z[3]), i + 3u))));
}

fn ternary_tail(q: u32) {
    for (var j = q * 4u; j < info.numel; j = j + 1u) {
        store_out(info.out.offset + j, ternary_op(load_a(info.a.offset + j), load_b(info.b.offset + j), load_c(info.c.offset + j), j));
    }
}

fn fill_load(q: u32, o: vec4<u32>) -> Quads {
    return Quads(vec4<f32>(), vec4<f32>(), vec4<f32>());
}

fn fill_store(q: u32, o: vec4<u32>, v: Quads) {
    let i = q * 4u;
    store4_out(o.x + q, vec4<f32>(f32(fill_op(i)), f32(fill_op(i + 1u)), f32(fill_op(i + 2u)), f32(fill_op(i + 3u))));
}

fn fill_tail(q: u32) {
    for (var j = q * 4u; j < info.numel; j = j + 1u) {
        store_out(info.out.offset + j, fill_op(j));
    }
}

// One of the four (the kernels layer names it in QUADS) over the contiguous operands. A workgroup covers
// 1024 consecutive quads, each invocation four of them 256 apart, so that neighbouring
// invocations touch neighbouring quads. Several quads per invocation spread the per-invocation
// cost (1.3-1.4x on lavapipe); all four are read before any is written, so that their loads
// are in flight together (the output may share a buffer with the inputs, so a compiler could
// not move a load past an earlier store itself). Only the last, partial workgroup checks
// bounds per quad. Keep QUADS_PER_GROUP in src/kernels/elementwise.rs in step.
@compute @workgroup_size(256)
fn quads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    read_scalars();
    let o = vec4<u32>(info.out.offset, info.a.offset, info.b.offset, info.c.offset) / 4u;
    let group = wid.x + wid.y * nwg.x;
    let first = group * 1024u + lid.x;
    // Whole workgroups (compared by division: (group + 1) * 4096 could wrap).
    if (group < info.numel / 4096u) {
        let v0 = {{QUADS}}_load(first, o);
        let v1 = {{QUADS}}_load(first + 256u, o);
        let v2 = {{QUADS}}_load(first + 512u, o);
        let v3 = {{QUADS}}_load(first + 768u, o);
        {{QUADS}}_store(first, o, v0);
        {{QUADS}}_store(first + 256u, o, v1);
        {{QUADS}}_store(first + 512u, o, v2);
        {{QUADS}}_store(first + 768u, o, v3);
    } else {
        for (var j = 0u; j < 4u; j = j + 1u) {
            let q = first + j * 256u;
            if (q < info.numel / 4u) {
                {{QUADS}}_store(q, o, {{QUADS}}_load(q, o));
            } else {
                {{QUADS}}_tail(q);
            }
        }
    }
}

// _amp_foreach_non_finite_check_and_unscale_ on one gradient: out (the gradient itself) becomes
// a * b (b: the inverse scale), and c (found_inf) 1 if a value is inf or NaN. Every invocation
// that finds one writes the same 1, so their order does not matter.
@compute @workgroup_size(256)
fn unscale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    let x = f32(load_a(offset_of(i, info.a)));
    // By its bits: WGSL lets compilers assume floats are finite, so x != x may fold away.
    if ((bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u) {
        store_c(offset_of(i, info.c), c_t(1.0));
    }
    store_out(offset_of(i, info.out), out_t(x * f32(load_b(offset_of(i, info.b)))));
}

// torch.gather along dimension info.scalar: out[p] = a[p with p[dim] replaced by b[p]]; b is laid
// out in out's shape (index_select and embedding give a 1-D index broadcast to it). Indices are
// clamped into [0, info.limit) (PyTorch raises a device-side assert instead).
@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    let dim = info.scalar;
    let picked = u32(clamp(i32(load_b(offset_of(i, info.b))), 0, i32(info.limit) - 1));
    var rem = i;
    var src = info.a.offset;
    for (var d = i32(info.ndim) - 1; d >= 0; d = d - 1) {
        let n = info.shape[u32(d)];
        let c = select(rem % n, picked, u32(d) == dim);
        rem = rem / n;
        src = src + c * info.a.strides[u32(d)];
    }
    store_out(offset_of(i, info.out), out_t(load_a(src)));
}

// gather's backward (scatter_add_ into zeros): out[p] is the sum of a[p with p[dim] = j] over
// the j where b[p with p[dim] = j] (clamped into out) == p[dim]; a and b have one shape,
// info.limit its length along dim. One invocation per output element, no atomics: the sums are deterministic.
@compute @workgroup_size(256)
fn scatter_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= info.numel) { return; }
    let dim = info.scalar;
    var rem = i;
    var src = info.a.offset;
    var idx = info.b.offset;
    var picked = 0;
    for (var d = i32(info.ndim) - 1; d >= 0; d = d - 1) {
        let n = info.shape[u32(d)];
        let c = rem % n;
        rem = rem / n;
        if (u32(d) == dim) {
            picked = i32(c);
        } else {
            src = src + c * info.a.strides[u32(d)];
            idx = idx + c * info.b.strides[u32(d)];
        }
    }
    // Indices clamp as gather's do, so that every element read gets its gradient.
    let last = i32(info.shape[dim]) - 1;
    var acc = 0.0;
    for (var j = 0u; j < info.limit; j = j + 1u) {
        if (clamp(i32(load_b(idx + j * info.b.strides[dim])), 0, last) == picked) {
            acc = acc + f32(load_a(src + j * info.a.strides[dim]));
        }
    }
    store_out(offset_of(i, info.out), out_t(acc));
}

// nll_loss's forward with reduction "mean": out = -(the sum of a[r, b[r]] over the rows r whose
// target b[r] is not -100, ignore_index) / their count, and c (total_weight) = that count.
// info.limit: the rows; info.scalar: the classes (targets are clamped into them, where PyTorch
// raises a device-side assert). One invocation sums the rows in order, in f32.
@compute @workgroup_size(256)
fn nll_loss(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (index(gid, nwg) != 0u) { return; }
    var total = 0.0;
    var count = 0.0;
    for (var r = 0u; r < info.limit; r = r + 1u) {
        // (target and class are WGSL reserved words.)
        let wanted = i32(load_b(info.b.offset + r * info.b.strides[0]));
        if (wanted == -100) { continue; }
        let col = u32(clamp(wanted, 0, i32(info.scalar) - 1));
        total = total + f32(load_a(info.a.offset + r * info.a.strides[0] + col * info.a.strides[1]));
        count = count + 1.0;
    }
    store_out(info.out.offset, out_t(-total / count));
    store_c(info.c.offset, c_t(count));
}
