// Shared by every kernel family (the kernels layer puts it where a family says COMMON).
// Strided indexing: info[1] is the number of dimensions and info[2..10] the shape iterated;
// a tensor's layout at info[base] is its element offset followed by its strides.
@group(0) @binding(0) var<storage, read> info: array<u32>;

// Element offset of linear index i (row-major over the shape) in the tensor laid out at base.
fn offset_of(i: u32, base: u32) -> u32 {
    var rem = i;
    var off = info[base];
    for (var d = i32(info[1]) - 1; d >= 0; d = d - 1) {
        let n = info[2u + u32(d)];
        off = off + (rem % n) * info[base + 1u + u32(d)];
        rem = rem / n;
    }
    return off;
}
