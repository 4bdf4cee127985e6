//! Each kernel family's metadata (shapes, strides, offsets, scalars) as a `#[repr(C)]` struct
//! whose bytes are bound at binding 0, and the WGSL declaration of the same struct, generated
//! from the Rust definition so that the two cannot disagree. All fields are 4-byte scalars or
//! arrays of them, which WGSL's storage layout places exactly as `repr(C)` does.

use bytemuck::{Pod, Zeroable};

/// Dimensions a strided operand carries (`tensor::MAX_DIMS`; checked there).
pub(crate) const META_DIMS: usize = 8;

/// A metadata struct and its WGSL declaration.
pub(crate) trait WgslStruct: Pod {
    const NAME: &'static str;
    /// `struct Name { field: type, ... }`.
    const WGSL: &'static str;
    /// The declarations of the structs it contains, in order.
    const DEPS: &'static [&'static str] = &[];
}

/// Defines a `#[repr(C)]` Pod struct and its WGSL declaration; each field names its WGSL type.
macro_rules! wgsl_struct {
    ($(#[$doc:meta])* $name:ident $([$($dep:ident),*])? { $($(#[$fdoc:meta])* $field:ident: $ty:ty => $wgsl:literal,)* }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Pod, Zeroable)]
        pub(crate) struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
        }

        impl WgslStruct for $name {
            const NAME: &'static str = stringify!($name);
            const WGSL: &'static str = concat!("struct ", stringify!($name), " {\n", $("    ", stringify!($field), ": ", $wgsl, ",\n",)* "}\n");
            $(const DEPS: &'static [&'static str] = &[$(<$dep as WgslStruct>::WGSL),*];)?
        }
    };
}

wgsl_struct! {
    /// Where a strided operand's elements are: its first element in its binding, and a stride
    /// per dimension of the shape iterated (unused dimensions 0).
    Strided {
        offset: u32 => "u32",
        strides: [u32; META_DIMS] => "array<u32, 8>",
    }
}

wgsl_struct! {
    /// Elementwise kernels: the output's shape, four operands broadcast to it (unused ones repeat
    /// the output), a scalar's bits, a random seed, and for `gather` the selected dimension's
    /// length (indices are clamped into it).
    ElementwiseMeta [Strided] {
        numel: u32 => "u32",
        ndim: u32 => "u32",
        shape: [u32; META_DIMS] => "array<u32, 8>",
        out: Strided => "Strided",
        a: Strided => "Strided",
        b: Strided => "Strided",
        c: Strided => "Strided",
        scalar: u32 => "u32",
        seed: u32 => "u32",
        limit: u32 => "u32",
    }
}

wgsl_struct! {
    /// Reductions: the output's shape (reduced dimensions of size 1), then the reduced
    /// dimensions' count, element count, sizes and input strides; a split reduction's parts
    /// per output and where they start in the `part` operand.
    ReduceMeta [Strided] {
        numel: u32 => "u32",
        ndim: u32 => "u32",
        shape: [u32; META_DIMS] => "array<u32, 8>",
        out: Strided => "Strided",
        a: Strided => "Strided",
        reduced: u32 => "u32",
        count: u32 => "u32",
        sizes: [u32; META_DIMS] => "array<u32, 8>",
        strides: [u32; META_DIMS] => "array<u32, 8>",
        parts: u32 => "u32",
        part: u32 => "u32",
    }
}

wgsl_struct! {
    /// Rows kernels: the row shape (the walked dimension of size 1), the walked dimension and
    /// its length, a float parameter (eps, correction), and layer_norm's weight, bias and saved
    /// statistics. Backward kernels walk the incoming gradient `g` (bound in the bias's slot)
    /// beside `a`.
    RowsMeta [Strided] {
        rows: u32 => "u32",
        ndim: u32 => "u32",
        shape: [u32; META_DIMS] => "array<u32, 8>",
        out: Strided => "Strided",
        a: Strided => "Strided",
        g: Strided => "Strided",
        dim: u32 => "u32",
        n: u32 => "u32",
        param: f32 => "f32",
        w_offset: u32 => "u32",
        w_stride: u32 => "u32",
        b_offset: u32 => "u32",
        b_stride: u32 => "u32",
        mean_offset: u32 => "u32",
        rstd_offset: u32 => "u32",
    }
}

wgsl_struct! {
    /// A matrix operand of a (batched) product: first element, and strides between batches,
    /// rows and columns.
    MatrixLayout {
        offset: u32 => "u32",
        batch_stride: u32 => "u32",
        row_stride: u32 => "u32",
        col_stride: u32 => "u32",
    }
}

wgsl_struct! {
    /// C[batch] = A[batch] @ B[batch]: A is m x k, B k x n.
    MatmulMeta [MatrixLayout] {
        m: u32 => "u32",
        n: u32 => "u32",
        k: u32 => "u32",
        batches: u32 => "u32",
        a: MatrixLayout => "MatrixLayout",
        b: MatrixLayout => "MatrixLayout",
        c: MatrixLayout => "MatrixLayout",
    }
}

/// The WGSL a kernel needs for metadata `M`: the structs it contains, then its own.
pub(crate) fn declarations<M: WgslStruct>() -> String {
    M::DEPS.iter().copied().chain([M::WGSL]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wgsl_declaration_follows_the_rust_struct() {
        assert_eq!(MatrixLayout::WGSL, "struct MatrixLayout {\n    offset: u32,\n    batch_stride: u32,\n    row_stride: u32,\n    col_stride: u32,\n}\n");
        assert!(declarations::<MatmulMeta>().starts_with("struct MatrixLayout {"));
        // Every field 4 bytes or arrays of them: repr(C) sizes are WGSL's storage sizes.
        assert_eq!(std::mem::size_of::<Strided>(), 4 * 9);
        assert_eq!(std::mem::size_of::<ElementwiseMeta>(), 4 * (2 + 8 + 4 * 9 + 3));
        assert_eq!(std::mem::size_of::<MatmulMeta>(), 4 * (4 + 3 * 4));
    }
}
