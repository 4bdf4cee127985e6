// Shared by every kernel family (the kernels layer puts it where a family says COMMON): the
// family's metadata struct, generated from its Rust definition (src/kernels/meta.rs), bound at 0.
{{META}}
@group(0) @binding(0) var<storage, read> info: {{META_TYPE}};

// The binary16 bits of x: infinities, NaN and values past f16's range (overflow to inf, as an
// IEEE conversion gives) by hand, since pack2x16float leaves them indeterminate; finite values
// as pack2x16float rounds them (Dawn's gives garbage for -inf, which a causal mask
// stores). Used where f16 is stored packed in u32 words (adapters without shader-f16).
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return sign | 0x7c00u | select(0u, 0x200u, (b & 0x7fffffu) != 0u);
    }
    let magnitude = bitcast<f32>(b & 0x7fffffffu);
    if (magnitude >= 65520.0) {
        return sign | 0x7c00u;
    }
    return (pack2x16float(vec2<f32>(min(magnitude, 65504.0), 0.0)) & 0xffffu) | sign;
}

// The bfloat16 bits of x: its top 16 bits, rounded to nearest even (PyTorch's
// round_to_nearest_even); every NaN becomes 0x7fc0 as there, infinities and overflow inf.
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fc0u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
