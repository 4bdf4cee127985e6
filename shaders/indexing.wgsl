// Strided indexing, for families whose metadata has the shape iterated (info.ndim, info.shape)
// and operands as `Strided` (the kernels layer puts it where a family says INDEXING).

// Element offset of linear index i (row-major over the shape) in the strided operand t.
fn offset_of(i: u32, t: Strided) -> u32 {
    var rem = i;
    var off = t.offset;
    for (var d = i32(info.ndim) - 1; d >= 0; d = d - 1) {
        let n = info.shape[u32(d)];
        off = off + (rem % n) * t.strides[u32(d)];
        rem = rem / n;
    }
    return off;
}
