//! Op -> WGSL pipeline + dispatch. One generic path: a kernel is a shader family (one file in
//! `shaders/`), an entry point and a specialisation (`{{NAME}}` placeholders: dtype, expression,
//! tile sizes). Pipelines are cached by that key. Every dispatch binds a small metadata array
//! (shapes, strides, offsets, scalars) at binding 0 and the tensors after it.

use crate::device::DeviceError;
use std::rc::Rc;
use wgpu::util::DeviceExt;

pub(crate) use crate::device::Device;

/// A shader file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    Elementwise,
    Reduce,
    Matmul,
}

impl Family {
    fn source(self) -> &'static str {
        match self {
            Family::Elementwise => include_str!("../../shaders/elementwise.wgsl"),
            Family::Reduce => include_str!("../../shaders/reduce.wgsl"),
            Family::Matmul => include_str!("../../shaders/matmul.wgsl"),
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

    /// Element access for `buffers` bindings: sets {{ENABLE}}, {{T}} (the value type) and
    /// {{BUFFERS}} (declarations with load/store functions).
    pub fn with_access(self, access: Access, buffers: usize) -> Kernel {
        self.with("ENABLE", access.enable).with("T", access.value).with("BUFFERS", access.declarations(buffers))
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
        let mut text = self.family.source().to_string();
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

/// How kernels hold one dtype's elements. Natively each element is an array element. f16 on an
/// adapter without `shader-f16` (the browser's software adapter) is stored two to a u32 word:
/// reads unpack, and writes replace their half of the word with a compare-and-swap loop, since
/// the neighbouring half may belong to another invocation (or to no operand at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    /// The WGSL type values have in registers.
    pub value: &'static str,
    storage: &'static str,
    enable: &'static str,
    packed: bool,
}

impl Access {
    pub fn native(value: &'static str) -> Access {
        Access { value, storage: value, enable: if value == "f16" { "enable f16;" } else { "" }, packed: false }
    }

    pub fn packed_f16() -> Access {
        Access { value: "f32", storage: "atomic<u32>", enable: "", packed: true }
    }

    /// Binding declarations `buf0..` at bindings 1.. with `load_bufK(i)` and `store_bufK(i, v)`.
    fn declarations(&self, buffers: usize) -> String {
        let mut out = String::new();
        for k in 0..buffers {
            let decl = format!("@group(0) @binding({}) var<storage, read_write> buf{k}: array<{}>;\n", k + 1, self.storage);
            out.push_str(&decl);
            if self.packed {
                out.push_str(&format!(
                    "fn load_buf{k}(i: u32) -> f32 {{ return unpack2x16float(atomicLoad(&buf{k}[i >> 1u]))[i & 1u]; }}\n\
                     fn store_buf{k}(i: u32, v: f32) {{\n\
                         let shift = (i & 1u) * 16u;\n\
                         let bits = (pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu) << shift;\n\
                         var old = atomicLoad(&buf{k}[i >> 1u]);\n\
                         loop {{\n\
                             let r = atomicCompareExchangeWeak(&buf{k}[i >> 1u], old, (old & ~(0xffffu << shift)) | bits);\n\
                             if (r.exchanged) {{ break; }}\n\
                             old = r.old_value;\n\
                         }}\n\
                     }}\n"
                ));
            } else {
                out.push_str(&format!(
                    "fn load_buf{k}(i: u32) -> {v} {{ return buf{k}[i]; }}\nfn store_buf{k}(i: u32, v: {v}) {{ buf{k}[i] = v; }}\n",
                    v = self.value
                ));
            }
        }
        out
    }
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
    pub fn new(operands: &[Arg], element_size: u64) -> Result<Bindings, DeviceError> {
        let mut ranges: Vec<Arg> = Vec::new();
        for a in operands {
            match ranges.iter_mut().find(|r| r.segment == a.segment) {
                Some(r) => {
                    let end = (r.offset + r.size).max(a.offset + a.size);
                    r.offset = r.offset.min(a.offset);
                    r.size = end - r.offset;
                }
                None => ranges.push(a.clone()),
            }
        }
        let operands = operands
            .iter()
            .map(|a| {
                let k = ranges.iter().position(|r| r.segment == a.segment).unwrap();
                let base = (a.offset - ranges[k].offset) / element_size;
                u32::try_from(base).map(|b| (k, b)).map_err(|_| DeviceError::Unsupported("operands too far apart in one segment".into()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Bindings { ranges, operands })
    }

    /// Number of operands.
    pub fn len(&self) -> usize {
        self.operands.len()
    }

    /// The WGSL variable that holds operand `i`.
    pub fn name(&self, i: usize) -> String {
        format!("buf{}", self.operands[i].0)
    }

    /// Operand `i`'s first element inside its binding.
    pub fn base(&self, i: usize) -> u32 {
        self.operands[i].1
    }
}

/// Threads per workgroup for 1-D kernels; every adapter allows 64 (WebGPU's minimum is 256).
pub(crate) const WORKGROUP: u32 = 64;

fn pipeline(device: &Device, kernel: &Kernel, tensors: usize) -> Result<Rc<Pipeline>, DeviceError> {
    let ctx = device.gpu_context().expect("kernels run on GPU devices");
    let key = kernel.key(tensors);
    if let Some(p) = ctx.pipelines.borrow().get(&key) {
        return Ok(p.clone());
    }
    let source = kernel.specialize()?;
    let label = format!("{:?}/{}", kernel.family, kernel.entry);
    let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(&label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
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
    let pipeline_layout = ctx.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&label),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
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
        return Err(DeviceError::Unsupported(format!(
            "operands span {} bytes of one segment, more than max_storage_buffer_binding_size ({limit})",
            r.size
        )));
    }
    let p = pipeline(device, kernel, args.ranges.len())?;
    let meta_buffer = ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("tensormem kernel metadata"),
        contents: bytemuck::cast_slice(if meta.is_empty() { &[0u32] } else { meta }),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: meta_buffer.as_entire_binding() }];
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
