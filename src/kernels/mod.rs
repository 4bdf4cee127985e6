//! Kernels as code generation: a kernel is a shader family (one file in `shaders/`), an entry
//! point and a specialisation (`{{NAME}}` placeholders: dtype, expression, tile sizes). This
//! module writes the WGSL and knows nothing of devices; the device compiles it (caching the
//! pipeline by the kernel's key) and launches it (`device::gpu`). Every dispatch binds a small
//! metadata array (shapes, strides, offsets, scalars) at binding 0 and the tensors after it.

pub(crate) mod meta;

use crate::dtype::DType;
pub(crate) use meta::{ElementwiseMeta, MatmulMeta, MatrixLayout, ReduceMeta, RowsMeta, Strided, WgslStruct};

/// What code generation refuses: a dtype no kernel takes, operands it cannot address.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(pub String);

/// A shader file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    Elementwise,
    Reduce,
    Matmul,
    Rows,
}

impl Family {
    fn source(self) -> &'static str {
        match self {
            Family::Elementwise => include_str!("../../shaders/elementwise.wgsl"),
            Family::Reduce => include_str!("../../shaders/reduce.wgsl"),
            Family::Matmul => include_str!("../../shaders/matmul.wgsl"),
            Family::Rows => include_str!("../../shaders/rows.wgsl"),
        }
    }
}

/// What to compile: a family, an entry point and the values of its placeholders.
#[derive(Debug, Clone)]
pub(crate) struct Kernel {
    pub family: Family,
    pub entry: &'static str,
    pub spec: Vec<(&'static str, String)>,
}

impl Kernel {
    pub fn new(family: Family, entry: &'static str) -> Kernel {
        Kernel { family, entry, spec: Vec::new() }
    }

    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Kernel {
        self.spec.push((name, value.into()));
        self
    }

    /// The family's metadata struct (see `meta`): declared in WGSL and bound at 0 as `info`.
    pub fn with_meta<M: WgslStruct>(self) -> Kernel {
        self.with("META", meta::declarations::<M>()).with("META_TYPE", M::NAME)
    }

    /// The operands, named as the shader names them (`out`, `a`, ...), in binding order: sets
    /// BUFFERS (declarations and load/store functions), ENABLE (f16) and T (the first operand's
    /// value type). `native_f16`: the adapter has `shader-f16`.
    pub fn with_operands(self, native_f16: bool, bindings: &BindingPlan, operands: &[(&str, DType)]) -> Result<Kernel, KernelError> {
        self.with_operands_vec4(native_f16, bindings, operands, &[])
    }

    /// As `with_operands`, declaring the named f32 operands as `array<vec4<f32>>` (with
    /// `load4_x`), for kernels that load 128 bits at a time. The caller checks alignment.
    pub fn with_operands_vec4(self, native_f16: bool, bindings: &BindingPlan, operands: &[(&str, DType)], vec4: &[&str]) -> Result<Kernel, KernelError> {
        let enable = if native_f16 && operands.iter().any(|o| o.1 == DType::F16) { "enable f16;" } else { "" };
        let t = value_type(operands[0].1, native_f16)?;
        Ok(self.with("ENABLE", enable).with("T", t).with("BUFFERS", declarations(bindings, operands, native_f16, vec4)?))
    }

    /// What identifies the compiled pipeline.
    pub fn key(&self, tensors: usize) -> String {
        let mut key = format!("{:?}/{}/{}", self.family, self.entry, tensors);
        for (k, v) in &self.spec {
            key.push_str(&format!(";{k}={v}"));
        }
        key
    }

    /// The family's source with every placeholder replaced.
    pub fn specialize(&self) -> Result<String, KernelError> {
        let mut text = self
            .family
            .source()
            .replace("{{COMMON}}", include_str!("../../shaders/common.wgsl"))
            .replace("{{INDEXING}}", include_str!("../../shaders/indexing.wgsl"));
        for (name, value) in &self.spec {
            text = text.replace(&format!("{{{{{name}}}}}"), value);
        }
        match text.find("{{") {
            Some(at) => {
                Err(KernelError(format!("kernel {:?}/{} leaves placeholder {} unspecified", self.family, self.entry, &text[at..(at + 24).min(text.len())])))
            }
            None => Ok(text),
        }
    }
}

/// The type values of `dtype` have in registers: what `load_x` returns and `store_x` takes.
/// f16 is f16 where the adapter has `shader-f16`, else f32; bf16 (which WGSL lacks) is f32, its
/// top 16 bits stored; 8-bit types widen to 32 bits.
pub(crate) fn value_type(dtype: DType, native_f16: bool) -> Result<&'static str, KernelError> {
    Ok(match dtype {
        DType::F32 | DType::BF16 => "f32",
        DType::F16 if native_f16 => "f16",
        DType::F16 => "f32",
        // int64 holds indices and token ids: kernels use the low 32 bits (checked on upload).
        DType::I32 | DType::I8 | DType::I64 => "i32",
        DType::U32 | DType::U8 | DType::Bool => "u32",
        other => {
            return Err(KernelError(format!(
                "{other} tensors exist for memory accounting only; GPU kernels take float32, float16, bfloat16, int32, uint32, int8, uint8 and bool"
            )));
        }
    })
}

/// The array element type when each element is one array element (else: packed in u32 words).
fn whole_element(dtype: DType, native_f16: bool) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::I32 => Some("i32"),
        DType::U32 => Some("u32"),
        DType::F16 if native_f16 => Some("f16"),
        _ => None,
    }
}

/// Binding declarations (`buf0..` at bindings 1..) and, per operand `x`, `load_x(i)` and
/// `store_x(i, v)` in element units. A binding whose operands all have one whole-element type is
/// an array of it. Otherwise (f16 without `shader-f16`, 8-bit types, or operands of different
/// types sharing a segment) it is an array of atomic u32 words: loads extract the element, and
/// stores of sub-word elements replace their lane with a compare-and-swap loop, since the rest of
/// the word may belong to another invocation, or to no operand at all.
fn declarations(bindings: &BindingPlan, operands: &[(&str, DType)], native_f16: bool, vec4: &[&str]) -> Result<String, KernelError> {
    let mut out = String::new();
    let buffers = bindings.ranges.len();
    let mut words = vec![false; buffers];
    let mut quads = vec![false; buffers];
    for k in 0..buffers {
        let members: Vec<usize> = (0..operands.len()).filter(|&i| bindings.operands[i].0 == k).collect();
        let types: Vec<DType> = members.iter().map(|&i| operands[i].1).collect();
        let whole = whole_element(types[0], native_f16).filter(|_| types.iter().all(|&t| t == types[0]));
        words[k] = whole.is_none();
        // 128-bit loads for an f32 operand that has its binding to itself.
        quads[k] = members.len() == 1 && types[0] == DType::F32 && vec4.contains(&operands[members[0]].0);
        let element = if quads[k] { "vec4<f32>" } else { whole.unwrap_or("atomic<u32>") };
        out.push_str(&format!("@group(0) @binding({}) var<storage, read_write> buf{k}: array<{element}>;\n", k + 1));
        if words[k] {
            out.push_str(&format!(
                "fn cas_buf{k}(w: u32, mask: u32, bits: u32) {{\n  var old = atomicLoad(&buf{k}[w]);\n  loop {{\n    let r = atomicCompareExchangeWeak(&buf{k}[w], old, (old & ~mask) | (bits & mask));\n    if (r.exchanged) {{ break; }}\n    old = r.old_value;\n  }}\n}}\n"
            ));
        }
    }
    for (i, &(name, dtype)) in operands.iter().enumerate() {
        let k = bindings.operands[i].0;
        let v = value_type(dtype, native_f16)?;
        let buf = format!("buf{k}");
        let (load, store) = if quads[k] {
            out.push_str(&format!("fn load4_{name}(i4: u32) -> vec4<f32> {{ return {buf}[i4]; }}\n"));
            (format!("return {buf}[i >> 2u][i & 3u];"), format!("{buf}[i >> 2u][i & 3u] = v;"))
        } else if !words[k] {
            (format!("return {buf}[i];"), format!("{buf}[i] = v;"))
        } else {
            match dtype.size() {
                8 => (
                    format!("return bitcast<i32>(atomicLoad(&{buf}[i * 2u]));"),
                    format!("atomicStore(&{buf}[i * 2u], bitcast<u32>(v));\n  atomicStore(&{buf}[i * 2u + 1u], select(0u, 0xffffffffu, v < 0));"),
                ),
                4 => (format!("return bitcast<{v}>(atomicLoad(&{buf}[i]));"), format!("atomicStore(&{buf}[i], bitcast<u32>(v));")),
                2 if dtype == DType::BF16 => (
                    format!("return bitcast<f32>(((atomicLoad(&{buf}[i >> 1u]) >> ((i & 1u) * 16u)) & 0xffffu) << 16u);"),
                    format!("let shift = (i & 1u) * 16u;\n  cas_{buf}(i >> 1u, 0xffffu << shift, bf16_bits(v) << shift);"),
                ),
                2 => (
                    format!("return {v}(unpack2x16float(atomicLoad(&{buf}[i >> 1u]))[i & 1u]);"),
                    format!("let shift = (i & 1u) * 16u;\n  cas_{buf}(i >> 1u, 0xffffu << shift, f16_bits(f32(v)) << shift);"),
                ),
                _ => {
                    let load = if dtype == DType::I8 {
                        format!("return bitcast<i32>(atomicLoad(&{buf}[i >> 2u]) << (24u - (i & 3u) * 8u)) >> 24u;")
                    } else {
                        format!("return (atomicLoad(&{buf}[i >> 2u]) >> ((i & 3u) * 8u)) & 0xffu;")
                    };
                    (load, format!("let shift = (i & 3u) * 8u;\n  cas_{buf}(i >> 2u, 0xffu << shift, (bitcast<u32>(v) & 0xffu) << shift);"))
                }
            }
        };
        if !quads[k] {
            // Kernels with 128-bit loads compile with the module even when another entry runs.
            out.push_str(&format!(
                "fn load4_{name}(i4: u32) -> vec4<f32> {{ let i = i4 * 4u; return vec4<f32>(f32(load_{name}(i)), f32(load_{name}(i + 1u)), f32(load_{name}(i + 2u)), f32(load_{name}(i + 3u))); }}\n"
            ));
        }
        // `x_t` names operand x's value type, so shared code can convert to it.
        out.push_str(&format!("alias {name}_t = {v};\nfn load_{name}(i: u32) -> {v} {{\n  {load}\n}}\nfn store_{name}(i: u32, v: {v}) {{\n  {store}\n}}\n"));
    }
    Ok(out)
}

/// Where a dispatch's operands bind. WebGPU forbids two writable bindings whose ranges overlap,
/// and operands often share a segment (one buffer), or are the same tensor; so each distinct
/// range is bound once, over what its operands span, and each operand gets its binding and its
/// element offset inside it. Pure data: the device puts buffers behind the ranges.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BindingPlan {
    /// Each binding's (segment, byte offset, byte size).
    pub ranges: Vec<(u64, u64, u64)>,
    /// Each operand's binding and first element in it.
    operands: Vec<(usize, u32)>,
}

impl BindingPlan {
    /// `operands`: each one's (segment, byte offset, byte size) and element size.
    pub fn new(operands: &[(u64, u64, u64)], element_sizes: &[u64]) -> Result<BindingPlan, KernelError> {
        // Operands whose bytes overlap (the same tensor twice, views of one storage) share a
        // binding; disjoint blocks bind separately even within one buffer.
        let overlaps = |r: &(u64, u64, u64), a: &(u64, u64, u64)| r.0 == a.0 && a.1 < r.1 + r.2 && r.1 < a.1 + a.2;
        let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
        for a in operands {
            let mut merged = *a;
            while let Some(i) = ranges.iter().position(|r| overlaps(r, &merged)) {
                let r = ranges.swap_remove(i);
                let end = (r.1 + r.2).max(merged.1 + merged.2);
                merged.1 = r.1.min(merged.1);
                merged.2 = end - merged.1;
            }
            ranges.push(merged);
        }
        let operands = operands
            .iter()
            .zip(element_sizes)
            .map(|(a, &element_size)| {
                let k = ranges.iter().position(|r| overlaps(r, a)).expect("every operand lies in a range");
                let base = (a.1 - ranges[k].1) / element_size;
                u32::try_from(base).map(|b| (k, b)).map_err(|_| KernelError("operands too far apart in one segment".into()))
            })
            .collect::<Result<_, _>>()?;
        Ok(BindingPlan { ranges, operands })
    }

    /// Whether operand `i` has its binding to itself.
    pub fn exclusive(&self, i: usize) -> bool {
        let k = self.operands[i].0;
        self.operands.iter().filter(|o| o.0 == k).count() == 1
    }

    /// Operand `i`'s first element inside its binding.
    pub fn base(&self, i: usize) -> u32 {
        self.operands[i].1
    }
}

/// Threads per workgroup for 1-D kernels that loop per invocation (reduce, rows).
pub(crate) const WORKGROUP: u32 = 64;
/// Threads per workgroup for elementwise kernels: WebGPU guarantees 256, and fewer, larger
/// workgroups cost less to schedule (notably on CPU drivers).
pub(crate) const ELEMENTWISE_WORKGROUP: u32 = 256;

/// How many workgroups a launch runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Grid {
    /// `threads` invocations of a 1-D kernel, `workgroup` per group (groups spread over x and y
    /// when x alone would exceed the adapter's limit).
    Threads { threads: u64, workgroup: u32 },
    /// Exactly these workgroups.
    Groups([u32; 3]),
}
