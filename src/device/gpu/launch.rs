//! Launching kernels on a GPU device (the operands' bindings are `device::bindings`): the kernels module writes WGSL (`crate::kernels`); the
//! device compiles it once per kernel key (its pipeline cache), binds the operands' buffers and
//! records the dispatch.

use super::super::{Bindings, Device, DeviceError};
use crate::kernels::{Grid, Kernel, WgslStruct};
use std::rc::Rc;

pub(crate) struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// What a bind group binds: the pipeline (by address: pipelines live as long as the device),
/// the metadata buffer and its binding size, and each tensor binding's buffer, offset and size.
/// Buffers compare by identity, and a cached bind group keeps its buffers, so a key never
/// matches a buffer made later.
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    pipeline: usize,
    metadata: (wgpu::Buffer, u64),
    tensors: Vec<(wgpu::Buffer, u64, u64)>,
}

/// Bind groups kept at most; past it the cache starts again (a loop's working set is far
/// smaller). A released segment's buffer is destroyed whatever holds it: its bind groups stay
/// unused until then.
const MAX_BIND_GROUPS: usize = 4096;

impl Device {
    fn pipeline(&self, kernel: &Kernel) -> Result<Rc<Pipeline>, DeviceError> {
        let ctx = self.gpu_context().expect("kernels run on GPU devices");
        // A hit hashes the kernel's description; nothing is cloned or written.
        if let Some(p) = ctx.pipelines.borrow().get(kernel) {
            return Ok(p.clone());
        }
        let tensors = kernel.bindings();
        let source = kernel.specialize()?;
        let label = format!("{:?}/{}", kernel.family, kernel.entry);
        let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(source.into()) });
        let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            // The metadata (binding 0) sits at a dynamic offset in the batch's one buffer, so
            // that the bind group does not change with it.
            ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Storage { read_only }, has_dynamic_offset: binding == 0, min_binding_size: None },
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
        ctx.pipelines.borrow_mut().insert(kernel.clone(), p.clone());
        Ok(p)
    }

    /// Records one dispatch of `kernel` over `args` with its metadata (the struct the kernel
    /// declared with `with_meta`), respecting the adapter's limits (a launch beyond them is an
    /// error, not a crash).
    pub(crate) fn launch<M: WgslStruct>(&self, kernel: &Kernel, meta: &M, args: &Bindings, grid: Grid) -> Result<(), DeviceError> {
        let ctx = self.gpu_context().expect("kernels run on GPU devices");
        let max = ctx.limits.max_compute_workgroups_per_dimension;
        let groups = match grid {
            Grid::Threads { threads: 0, .. } => return Ok(()),
            Grid::Threads { threads, workgroup } => {
                let groups = threads.div_ceil(workgroup as u64);
                let x = groups.min(max as u64);
                let y = groups.div_ceil(x);
                if y > max as u64 {
                    return Err(DeviceError::Unsupported(format!("{threads} threads exceed this adapter's dispatch limits")));
                }
                [x as u32, y as u32, 1]
            }
            Grid::Groups(groups) => groups,
        };
        if groups.iter().any(|&g| g > max) {
            return Err(DeviceError::Unsupported(format!("dispatch of {groups:?} workgroups exceeds this adapter's limit of {max} per dimension")));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let limit = ctx.summary.max_storage_buffer_binding_size;
        if let Some(r) = args.plan.ranges.iter().find(|r| r.2 > limit) {
            return Err(DeviceError::Unsupported(format!("operands span {} bytes of one segment, more than max_storage_buffer_binding_size ({limit})", r.2)));
        }
        debug_assert_eq!(kernel.bindings(), args.plan.ranges.len(), "the kernel was specialised for these bindings");
        let p = self.pipeline(kernel)?;
        let (meta_buffer, meta_offset, meta_size) = ctx.metadata_slot(bytemuck::bytes_of(meta))?;
        // Bindings round up to whole 16-byte quads, so an array of vec4 (of f32, or of f16: 8
        // bytes) reaches a tensor's last, partial quad; blocks are multiples of 512 bytes, so the
        // quad is inside the block.
        let key = BindKey {
            pipeline: Rc::as_ptr(&p) as usize,
            metadata: (meta_buffer, meta_size),
            tensors: args.plan.ranges.iter().zip(&args.buffers).map(|(&(_, offset, size), b)| (b.clone(), offset, size.next_multiple_of(16).max(16))).collect(),
        };
        let bind_group = {
            let mut cache = ctx.bind_groups.borrow_mut();
            if let Some(group) = cache.get(&key) {
                group.clone()
            } else {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &key.metadata.0, offset: 0, size: wgpu::BufferSize::new(meta_size) }),
                }];
                for (i, (buffer, offset, size)) in key.tensors.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset: *offset, size: wgpu::BufferSize::new(*size) }),
                    });
                }
                let group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &p.layout, entries: &entries });
                if cache.len() >= MAX_BIND_GROUPS {
                    cache.clear();
                }
                cache.insert(key, group.clone());
                group
            }
        };
        let dynamic_offset = u32::try_from(meta_offset).map_err(|_| DeviceError::Unsupported("kernel metadata beyond 4 GiB".into()))?;
        ctx.record_dispatch(|pass| {
            pass.set_pipeline(&p.pipeline);
            pass.set_bind_group(0, &bind_group, &[dynamic_offset]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        });
        Ok(())
    }
}
