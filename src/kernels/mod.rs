//! Kernels as code generation: a kernel is a shader family (one file in `shaders/`), an entry
//! point and a specialisation (`{{NAME}}` placeholders: dtype, expression, tile sizes). This
//! module writes the WGSL and knows nothing of devices; the device compiles it (caching the
//! pipeline by the kernel's key) and launches it (`device::gpu`). Every dispatch binds a small
//! metadata array (shapes, strides, offsets, scalars) at binding 0 and the tensors after it.

pub(crate) mod elementwise;
pub(crate) mod matmul;
pub(crate) mod meta;

use crate::dtype::DType;
pub(crate) use elementwise::WgslScalar;
pub(crate) use meta::{ElementwiseMeta, MatmulMeta, MatrixLayout, ReduceMeta, RowsMeta, Strided, WgslStruct};
use std::borrow::Cow;

/// What code generation refuses: a dtype no kernel takes, operands it cannot address.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(pub String);

/// A shader file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    Elementwise,
    Reduce,
    ReduceSplit,
    Matmul,
    MatmulRegister,
    MatmulStaged,
    Rows,
}

impl Family {
    fn source(self) -> &'static str {
        match self {
            Family::Elementwise => include_str!("../../shaders/elementwise.wgsl"),
            Family::Reduce => include_str!("../../shaders/reduce.wgsl"),
            Family::ReduceSplit => include_str!("../../shaders/reduce_split.wgsl"),
            Family::Matmul => include_str!("../../shaders/matmul.wgsl"),
            Family::MatmulRegister => include_str!("../../shaders/matmul_register.wgsl"),
            Family::MatmulStaged => include_str!("../../shaders/matmul_staged.wgsl"),
            Family::Rows => include_str!("../../shaders/rows.wgsl"),
        }
    }
}

/// What to compile: a family, an entry point and what its placeholders depend on. This is
/// also the pipeline cache's key, so it holds the small things the WGSL is made from (dtypes,
/// binding layout, short expressions), never the WGSL itself: a cache hit compares and hashes
/// these and writes no source (`specialize` runs only on a miss).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Kernel {
    pub family: Family,
    pub entry: &'static str,
    spec: Vec<(&'static str, Cow<'static, str>)>,
    meta: Option<Meta>,
    operands: Option<Operands>,
    body: Option<matmul::MatmulBody>,
}

/// The metadata struct a kernel binds at 0: named by its WGSL name, declared on demand.
#[derive(Debug, Clone, Copy)]
struct Meta {
    name: &'static str,
    declare: fn() -> String,
}

impl PartialEq for Meta {
    fn eq(&self, other: &Meta) -> bool {
        self.name == other.name
    }
}
impl Eq for Meta {}
impl std::hash::Hash for Meta {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

/// The operands as the declarations need them: names, dtypes, which binding each is in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Operands {
    native_f16: bool,
    list: Vec<(&'static str, DType)>,
    binding_of: Vec<usize>,
    bindings: usize,
    vec4: Vec<&'static str>,
}

impl Kernel {
    pub fn new(family: Family, entry: &'static str) -> Kernel {
        Kernel { family, entry, spec: Vec::new(), meta: None, operands: None, body: None }
    }

    pub fn with(mut self, name: &'static str, value: impl Into<Cow<'static, str>>) -> Kernel {
        self.spec.push((name, value.into()));
        self
    }

    /// The family's metadata struct (see `meta`): declared in WGSL and bound at 0 as `info`.
    pub fn with_meta<M: WgslStruct>(mut self) -> Kernel {
        self.meta = Some(Meta { name: M::NAME, declare: meta::declarations::<M> });
        self
    }

    /// A generated matmul body (BODY in `matmul_register.wgsl` or `matmul_staged.wgsl`).
    pub fn with_body(mut self, body: matmul::MatmulBody) -> Kernel {
        self.body = Some(body);
        self
    }

    /// The operands, named as the shader names them (`out`, `a`, ...), in binding order: sets
    /// BUFFERS (declarations and load/store functions), ENABLE (f16) and T (the first operand's
    /// value type). `native_f16`: the adapter has `shader-f16`.
    pub fn with_operands(self, native_f16: bool, bindings: &BindingPlan, operands: &[(&'static str, DType)]) -> Result<Kernel, KernelError> {
        self.with_operands_vec4(native_f16, bindings, operands, &[])
    }

    /// As `with_operands`, declaring the named f32 (and native f16) operands as arrays of vec4
    /// (with `load4_x` / `store4_x` in vec4<f32>), for kernels that load four elements at a time.
    /// Others named keep scalar access. The caller checks alignment.
    pub fn with_operands_vec4(
        mut self,
        native_f16: bool,
        bindings: &BindingPlan,
        operands: &[(&'static str, DType)],
        vec4: &[&'static str],
    ) -> Result<Kernel, KernelError> {
        for &(_, dtype) in operands {
            WgslScalar::of(dtype, native_f16)?;
        }
        self.operands = Some(Operands {
            native_f16,
            list: operands.to_vec(),
            binding_of: bindings.operands.iter().map(|o| o.0).collect(),
            bindings: bindings.ranges.len(),
            vec4: vec4.to_vec(),
        });
        Ok(self)
    }

    /// How many tensor bindings the kernel declares (after the metadata at 0).
    pub fn bindings(&self) -> usize {
        self.operands.as_ref().map_or(0, |o| o.bindings)
    }

    /// The family's source with every placeholder replaced.
    pub fn specialize(&self) -> Result<String, KernelError> {
        let mut text = self
            .family
            .source()
            .replace("{{COMMON}}", include_str!("../../shaders/common.wgsl"))
            .replace("{{INDEXING}}", include_str!("../../shaders/indexing.wgsl"))
            .replace("{{REDUCTION}}", include_str!("../../shaders/reduction.wgsl"));
        let mut spec: Vec<(&str, Cow<str>)> = self.spec.iter().map(|(k, v)| (*k, Cow::Borrowed(v.as_ref()))).collect();
        if let Some(meta) = &self.meta {
            spec.push(("META", (meta.declare)().into()));
            spec.push(("META_TYPE", meta.name.into()));
        }
        if let Some(o) = &self.operands {
            let enable = if o.native_f16 && o.list.iter().any(|o| o.1 == DType::F16) { "enable f16;" } else { "" };
            spec.push(("ENABLE", enable.into()));
            spec.push(("T", WgslScalar::of(o.list[0].1, o.native_f16)?.name().into()));
            spec.push(("BUFFERS", declarations(o)?.into()));
        }
        if let Some(body) = &self.body {
            spec.extend(body.placeholders());
        }
        for (name, value) in &spec {
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

/// The array element type when each element is one array element (else: packed in u32 words).
fn whole_element(dtype: DType, native_f16: bool) -> Option<WgslScalar> {
    match dtype {
        DType::F32 => Some(WgslScalar::F32),
        DType::I32 => Some(WgslScalar::I32),
        DType::U32 => Some(WgslScalar::U32),
        DType::F16 if native_f16 => Some(WgslScalar::F16),
        _ => None,
    }
}

/// Whether operands of `dtype` can be declared four elements at a time (`with_operands_vec4`:
/// 128 bits of f32, 64 of f16 where the adapter has `shader-f16`), alignment permitting.
pub(crate) fn loads_quads(dtype: DType, native_f16: bool) -> bool {
    dtype == DType::F32 || (dtype == DType::F16 && native_f16)
}

/// Binding declarations (`buf0..` at bindings 1..) and, per operand `x`, `load_x(i)` and
/// `store_x(i, v)` in element units. A binding whose operands all have one whole-element type is
/// an array of it. Otherwise (f16 without `shader-f16`, 8-bit types, or operands of different
/// types sharing a segment) it is an array of atomic u32 words: loads extract the element, and
/// stores of sub-word elements replace their lane with a compare-and-swap loop, since the rest of
/// the word may belong to another invocation, or to no operand at all.
fn declarations(o: &Operands) -> Result<String, KernelError> {
    let (operands, native_f16, vec4) = (&o.list, o.native_f16, &o.vec4);
    let mut out = String::new();
    let buffers = o.bindings;
    let mut words = vec![false; buffers];
    let mut quads = vec![false; buffers];
    for k in 0..buffers {
        let members: Vec<usize> = (0..operands.len()).filter(|&i| o.binding_of[i] == k).collect();
        let types: Vec<DType> = members.iter().map(|&i| operands[i].1).collect();
        let whole = whole_element(types[0], native_f16).filter(|_| types.iter().all(|&t| t == types[0]));
        words[k] = whole.is_none();
        // Four elements at a time (128 bits of f32, 64 of native f16) for a binding whose operands
        // are all listed and of one such type (the caller checked that each starts at a multiple
        // of 4 elements).
        let quad_type = match whole {
            Some(WgslScalar::F32) => Some("vec4<f32>"),
            Some(WgslScalar::F16) => Some("vec4<f16>"),
            _ => None,
        };
        quads[k] = quad_type.is_some() && members.iter().all(|&i| vec4.contains(&operands[i].0));
        let element = if quads[k] { quad_type.unwrap_or_default() } else { whole.map_or("atomic<u32>", WgslScalar::name) };
        out.push_str(&format!("@group(0) @binding({}) var<storage, read_write> buf{k}: array<{element}>;\n", k + 1));
        if words[k] {
            out.push_str(&format!(
                "fn cas_buf{k}(w: u32, mask: u32, bits: u32) {{\n  var old = atomicLoad(&buf{k}[w]);\n  loop {{\n    let r = atomicCompareExchangeWeak(&buf{k}[w], old, (old & ~mask) | (bits & mask));\n    if (r.exchanged) {{ break; }}\n    old = r.old_value;\n  }}\n}}\n"
            ));
        }
    }
    for (i, &(name, dtype)) in operands.iter().enumerate() {
        let k = o.binding_of[i];
        let v = WgslScalar::of(dtype, native_f16)?;
        let buf = format!("buf{k}");
        let (load, store) = if quads[k] {
            out.push_str(&format!("fn load4_{name}(i4: u32) -> vec4<f32> {{ return vec4<f32>({buf}[i4]); }}\n"));
            out.push_str(&format!("fn store4_{name}(i4: u32, v: vec4<f32>) {{ {buf}[i4] = vec4<{v}>(v); }}\n"));
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
                "fn load4_{name}(i4: u32) -> vec4<f32> {{ let i = i4 * 4u; return vec4<f32>(f32(load_{name}(i)), f32(load_{name}(i + 1u)), f32(load_{name}(i + 2u)), f32(load_{name}(i + 3u))); }}\nfn store4_{name}(i4: u32, v: vec4<f32>) {{ for (var l = 0u; l < 4u; l = l + 1u) {{ store_{name}(i4 * 4u + l, {v}(v[l])); }} }}\n"
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
