//! Op -> WGSL pipeline + dispatch. One generic path: a kernel is a shader family (one file in
//! `shaders/`), an entry point and a specialisation (`{{NAME}}` placeholders: dtype, expression,
//! tile sizes). Pipelines are cached by that key. Every dispatch binds a small metadata array
//! (shapes, strides, offsets, scalars) at binding 0 and the tensors after it.

use crate::device::DeviceError;
use crate::tensor::DType;
use std::rc::Rc;

pub(crate) use crate::device::Device;

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

    /// The operands, named as the shader names them (`out`, `a`, ...), in binding order: sets
    /// BUFFERS (declarations and load/store functions), ENABLE (f16) and T (the first operand's
    /// value type).
    pub fn with_operands(self, device: &Device, bindings: &Bindings, operands: &[(&str, DType)]) -> Result<Kernel, DeviceError> {
        self.with_operands_vec4(device, bindings, operands, &[])
    }

    /// As `with_operands`, declaring the named f32 operands as `array<vec4<f32>>` (with
    /// `load4_x`), for kernels that load 128 bits at a time. The caller checks alignment.
    pub fn with_operands_vec4(self, device: &Device, bindings: &Bindings, operands: &[(&str, DType)], vec4: &[&str]) -> Result<Kernel, DeviceError> {
        let native_f16 = device.adapter().is_some_and(|a| a.native_f16);
        let enable = if native_f16 && operands.iter().any(|o| o.1 == DType::F16) { "enable f16;" } else { "" };
        let t = value_type(operands[0].1, native_f16)?;
        Ok(self.with("ENABLE", enable).with("T", t).with("BUFFERS", declarations(bindings, operands, native_f16, vec4)?))
    }

    fn key(&self, tensors: usize) -> String {
        let mut key = format!("{:?}/{}/{}", self.family, self.entry, tensors);
        for (k, v) in &self.spec {
            key.push_str(&format!(";{k}={v}"));
        }
        key
    }

    /// The family's source with every placeholder replaced.
    fn specialize(&self) -> Result<String, DeviceError> {
        let mut text = self.family.source().replace("{{COMMON}}", include_str!("../../shaders/common.wgsl"));
        for (name, value) in &self.spec {
            text = text.replace(&format!("{{{{{name}}}}}"), value);
        }
        match text.find("{{") {
            Some(at) => Err(DeviceError::Unsupported(format!(
                "kernel {:?}/{} leaves placeholder {} unspecified",
                self.family,
                self.entry,
                &text[at..(at + 24).min(text.len())]
            ))),
            None => Ok(text),
        }
    }
}

/// The type values of `dtype` have in registers: what `load_x` returns and `store_x` takes.
/// f16 is f16 where the adapter has `shader-f16`, else f32; 8-bit types widen to 32 bits.
pub(crate) fn value_type(dtype: DType, native_f16: bool) -> Result<&'static str, DeviceError> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 if native_f16 => "f16",
        DType::F16 => "f32",
        // int64 holds indices and token ids: kernels use the low 32 bits (checked on upload).
        DType::I32 | DType::I8 | DType::I64 => "i32",
        DType::U32 | DType::U8 | DType::Bool => "u32",
        other => {
            return Err(DeviceError::Unsupported(format!(
                "{other} tensors exist for memory accounting only; GPU kernels take float32, float16, int32, uint32, int8, uint8 and bool"
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
fn declarations(bindings: &Bindings, operands: &[(&str, DType)], native_f16: bool, vec4: &[&str]) -> Result<String, DeviceError> {
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
                2 => (
                    format!("return {v}(unpack2x16float(atomicLoad(&{buf}[i >> 1u]))[i & 1u]);"),
                    format!("let shift = (i & 1u) * 16u;\n  cas_{buf}(i >> 1u, 0xffffu << shift, (pack2x16float(vec2<f32>(f32(v), 0.0)) & 0xffffu) << shift);"),
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

pub(crate) struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// A tensor's bytes: its segment's buffer, the block's offset in it and a size.
#[derive(Clone)]
pub(crate) struct Arg {
    pub buffer: wgpu::Buffer,
    pub segment: u64,
    pub offset: u64,
    pub size: u64,
}

/// The operands of one dispatch as bindings. WebGPU forbids two writable bindings whose ranges
/// overlap, and operands often share a segment (one buffer), or are the same tensor; so each
/// distinct segment is bound once, over the range its operands span, and each operand gets its
/// binding's name and its element offset inside it.
pub(crate) struct Bindings {
    ranges: Vec<Arg>,
    operands: Vec<(usize, u32)>,
}

impl Bindings {
    pub fn new(operands: &[Arg], element_sizes: &[u64]) -> Result<Bindings, DeviceError> {
        // Operands whose bytes overlap (the same tensor twice, views of one storage) share a
        // binding; disjoint blocks bind separately even within one buffer.
        let overlaps = |r: &Arg, a: &Arg| r.segment == a.segment && a.offset < r.offset + r.size && r.offset < a.offset + a.size;
        let mut ranges: Vec<Arg> = Vec::new();
        for a in operands {
            let mut merged = a.clone();
            while let Some(i) = ranges.iter().position(|r| overlaps(r, &merged)) {
                let r = ranges.swap_remove(i);
                let end = (r.offset + r.size).max(merged.offset + merged.size);
                merged.offset = r.offset.min(merged.offset);
                merged.size = end - merged.offset;
            }
            ranges.push(merged);
        }
        let operands = operands
            .iter()
            .zip(element_sizes)
            .map(|(a, &element_size)| {
                let k = ranges.iter().position(|r| overlaps(r, a)).expect("every operand lies in a range");
                let base = (a.offset - ranges[k].offset) / element_size;
                u32::try_from(base).map(|b| (k, b)).map_err(|_| DeviceError::Unsupported("operands too far apart in one segment".into()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Bindings { ranges, operands })
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

fn pipeline(device: &Device, kernel: &Kernel, tensors: usize) -> Result<Rc<Pipeline>, DeviceError> {
    let ctx = device.gpu_context().expect("kernels run on GPU devices");
    let key = kernel.key(tensors);
    if let Some(p) = ctx.pipelines.borrow().get(&key) {
        return Ok(p.clone());
    }
    let source = kernel.specialize()?;
    let label = format!("{:?}/{}", kernel.family, kernel.entry);
    let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source.into()) });
    let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Storage { read_only }, has_dynamic_offset: false, min_binding_size: None },
        count: None,
    };
    // Tensors bind read_write even when only read: WebGPU forbids one buffer (a segment) bound
    // read-only and writable in the same dispatch, and tensors often share a segment.
    let entries: Vec<_> = std::iter::once(storage(0, true)).chain((1..=tensors as u32).map(|b| storage(b, false))).collect();
    let layout = ctx.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(&label), entries: &entries });
    let pipeline_layout =
        ctx.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor { label: Some(&label), bind_group_layouts: &[Some(&layout)], immediate_size: 0 });
    let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&label),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(kernel.entry),
        compilation_options: Default::default(),
        cache: None,
    });
    // Natively a shader that does not validate is reported right here.
    ctx.take_error()?;
    let p = Rc::new(Pipeline { pipeline, layout });
    ctx.pipelines.borrow_mut().insert(key, p.clone());
    Ok(p)
}

/// Records one dispatch of `threads` invocations of a 1-D kernel (`workgroup` per group; groups
/// spread over x and y when x alone would exceed the adapter's limit).
pub(crate) fn dispatch(device: &Device, kernel: &Kernel, meta: &[u32], args: &Bindings, threads: u64, workgroup: u32) -> Result<(), DeviceError> {
    if threads == 0 {
        return Ok(());
    }
    let ctx = device.gpu_context().expect("kernels run on GPU devices");
    let groups = threads.div_ceil(workgroup as u64);
    let max = ctx.limits.max_compute_workgroups_per_dimension as u64;
    let x = groups.min(max);
    let y = groups.div_ceil(x);
    if y > max {
        return Err(DeviceError::Unsupported(format!("{threads} threads exceed this adapter's dispatch limits")));
    }
    dispatch_groups(device, kernel, meta, args, [x as u32, y as u32, 1])
}

/// Records one dispatch of exactly `groups` workgroups.
pub(crate) fn dispatch_groups(device: &Device, kernel: &Kernel, meta: &[u32], args: &Bindings, groups: [u32; 3]) -> Result<(), DeviceError> {
    let ctx = device.gpu_context().expect("kernels run on GPU devices");
    let max = ctx.limits.max_compute_workgroups_per_dimension;
    if groups.iter().any(|&g| g > max) {
        return Err(DeviceError::Unsupported(format!("dispatch of {groups:?} workgroups exceeds this adapter's limit of {max} per dimension")));
    }
    if groups.contains(&0) {
        return Ok(());
    }
    let limit = ctx.summary.max_storage_buffer_binding_size;
    if let Some(r) = args.ranges.iter().find(|r| r.size > limit) {
        return Err(DeviceError::Unsupported(format!("operands span {} bytes of one segment, more than max_storage_buffer_binding_size ({limit})", r.size)));
    }
    let p = pipeline(device, kernel, args.ranges.len())?;
    let (meta_buffer, meta_offset, meta_size) = ctx.metadata_slot(bytemuck::cast_slice(if meta.is_empty() { &[0u32] } else { meta }))?;
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &meta_buffer, offset: meta_offset, size: wgpu::BufferSize::new(meta_size) }),
    }];
    for (i, a) in args.ranges.iter().enumerate() {
        entries.push(wgpu::BindGroupEntry {
            binding: i as u32 + 1,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &a.buffer,
                offset: a.offset,
                size: wgpu::BufferSize::new(a.size.next_multiple_of(4).max(4)),
            }),
        });
    }
    let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &p.layout, entries: &entries });
    ctx.record(|encoder| {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(kernel.entry), timestamp_writes: None });
        pass.set_pipeline(&p.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    });
    Ok(())
}
