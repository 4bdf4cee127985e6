//! Reductions over any set of dimensions: sum, mean, max, min.

use super::cuda_reduce::{GlobalReduce, ReductionLaunch, global_reduce};
use super::{bind, check_u32, shape_meta, strided, values};
use crate::device::CudaCard;
use crate::kernels::{Family, Grid, Kernel, ReduceMeta, WORKGROUP, WgslScalar};
use crate::tensor::autocast as amp;
use crate::tensor::grad::not_differentiated_yet;
use crate::tensor::graph;
use crate::tensor::layout::{Layout, MAX_DIMS, wrap_dim};
use crate::tensor::{DType, Result, Tensor, TensorError};

/// Reductions of at least this many elements per output run a workgroup per output.
const WIDE_REDUCTION: usize = 2048;

/// On a GPU, contiguous reductions of at least this many elements per output share their
/// elements among several invocations (fewer: a thread per output).
const SHARED_REDUCTION: usize = 128;

/// How many invocations reduce each output (`reduce_lanes`), or None for one (`reduce`).
/// Long reductions take a workgroup of 256. On a GPU, a thread walking its own contiguous row
/// reads memory a row apart from its neighbours', which the hardware cannot coalesce (0.40 TB/s
/// for sums over rows of 1024 on an H100, a sixth of PyTorch's): there a contiguous reduction
/// gets about 32 elements per invocation, neighbours reading neighbours. A CPU adapter runs
/// a workgroup's invocations one SIMD batch after another and pays for each barrier, so a
/// thread per row, walking it through its cache, stays best there (measured on lavapipe).
fn reduction_lanes(n: usize, contiguous: bool, on_cpu: bool) -> Option<u32> {
    if n >= WIDE_REDUCTION {
        return Some(256);
    }
    (contiguous && !on_cpu && n >= SHARED_REDUCTION).then(|| (n.next_power_of_two() / 32).clamp(4, 256) as u32)
}

/// The most workgroups per output a split reduction uses on a CPU adapter.
const CPU_PARTS: u64 = 64;

/// A reduction's kernel substitutions (see shaders/reduce.wgsl).
struct ReductionSpec {
    name: &'static str,
    /// The accumulator's type in the kernel.
    acc: DType,
    init: String,
    /// Folds element x into acc.
    step: String,
    /// Folds another accumulator x into acc (a norm adds partial sums of squares, not squares).
    combine: String,
    finish: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduction {
    Sum,
    Mean,
    Max,
    Min,
    /// The L2 norm (`linalg.vector_norm`).
    Norm,
}

impl Tensor {
    /// Reduces `dims` (all of them when empty) into one new tensor, as ATen does: one kernel,
    /// one output allocation, however many dimensions.
    #[track_caller]
    fn reduce(&self, dims: &[isize], keepdim: bool, op: Reduction, dtype: DType) -> Result<Tensor> {
        self.reduce_as(dims, keepdim, op, dtype, None)
    }

    /// A sum that another op's own kernel computes (layer norm's backward sums the bias's
    /// gradient in its gamma/beta kernel): only the result, named `op`, is allocated, never
    /// the scratch of a split reduction.
    #[track_caller]
    pub(crate) fn sum_inside(&self, dims: &[isize], op: &'static str) -> Result<Tensor> {
        self.reduce_as(dims, false, Reduction::Sum, self.dtype, Some(op))
    }

    #[track_caller]
    fn reduce_as(&self, dims: &[isize], keepdim: bool, op: Reduction, dtype: DType, inside: Option<&'static str>) -> Result<Tensor> {
        let mut dims: Vec<usize> =
            if dims.is_empty() { (0..self.ndim()).collect() } else { dims.iter().map(|&d| wrap_dim(d, self.ndim())).collect::<Result<_>>()? };
        dims.sort_unstable();
        dims.dedup();
        if self.ndim() == 0 {
            return if dtype == self.dtype { self.clone() } else { self.to(dtype) };
        }
        let spec = self.reduction_spec(op)?;
        let name = inside.unwrap_or(spec.name);
        let mut out_shape = self.shape().to_vec();
        for &d in &dims {
            out_shape[d] = 1;
        }
        let n: usize = dims.iter().map(|&d| self.shape()[d]).product();
        let out = self.device().empty_tensor(&out_shape, dtype, name)?;
        let device = self.device().clone();
        if n == 0 && out.numel() > 0 {
            // Reducing nothing: the identity (PyTorch: sum 0, mean NaN; max and min raise).
            match op {
                Reduction::Sum => out.fill_(0.0)?,
                Reduction::Mean => out.fill_(f64::NAN)?,
                _ => return Err(TensorError::Shape(format!("{name} over an empty dimension has no identity"))),
            };
        } else {
            // PyTorch splits a long reduction over several blocks per output on a big enough
            // card, with a buffer and semaphores from the caching allocator, on both devices.
            let split = device.cuda_card().filter(|_| inside.is_none()).and_then(|card| self.cuda_split(&dims, op, card));
            // (No closures: they would hide the caller's location from the trace.)
            let scratch = match split {
                Some(s) => Some((
                    s,
                    device.empty_tensor(&[s.buffer_bytes as usize], DType::U8, name)?,
                    device.empty_tensor(&[s.semaphore_bytes as usize], DType::U8, name)?,
                )),
                None => None,
            };
            let launched = if out.launches(&[self], 0) {
                self.launch_reduction(&out, &dims, n, spec, scratch.as_ref().map(|(s, buffer, _)| (*s, buffer)))
            } else {
                Ok(())
            };
            // Freed as ATen frees them when the launch returns (or fails): semaphores, then the
            // buffer.
            if let Some((_, buffer, semaphores)) = scratch {
                drop(semaphores);
                drop(buffer);
            }
            launched?;
        }
        if keepdim {
            return Ok(out);
        }
        let shape: Vec<usize> = (0..self.ndim()).filter(|d| !dims.contains(d)).map(|d| self.shape()[d]).collect();
        // ATen allocates the result in its final shape: a tensor of its own, not a view.
        Ok(out.reshaped_result(Layout { shape: shape.clone(), strides: Layout::contiguous(&shape).strides, offset: out.layout.offset }))
    }

    /// How PyTorch would split this reduction on this card (see `cuda_reduce`), None when it
    /// runs one block per output.
    fn cuda_split(&self, dims: &[usize], op: Reduction, card: CudaCard) -> Option<GlobalReduce> {
        let reduced: Vec<bool> = (0..self.ndim()).map(|d| dims.contains(&d)).collect();
        let element = self.dtype.size() as u64;
        // ATen's accumulator (`arg_t`): float for floating sums, means and norms (double for
        // f64); the element itself for max and min, and for integer sums (which accumulate in
        // the output's type, here the input's: `sum(dtype=torch.int32)`).
        let acc_size = match op {
            Reduction::Sum | Reduction::Mean | Reduction::Norm if self.dtype.is_float() => element.max(4),
            _ => element,
        };
        let address = self.storage.block.map_or(0, |b| b.ptr) + self.layout.offset as u64 * element;
        let launch = ReductionLaunch { shape: self.shape(), strides: self.strides(), reduced: &reduced, input_index: address / element, acc_size };
        global_reduce(&launch, card)
    }

    /// Runs the kernel of a reduction of `n` elements per output into `out`: a thread per
    /// output for short ones, a workgroup per output for long ones, and for a reduction PyTorch
    /// splits, several workgroups per output keeping their partial results in `split`'s buffer.
    fn launch_reduction(&self, out: &Tensor, dims: &[usize], n: usize, spec: ReductionSpec, split: Option<(GlobalReduce, &Tensor)>) -> Result<()> {
        check_u32(self)?;
        let device = self.device();
        let outputs = out.numel() as u64;
        // A CPU adapter runs a workgroup's invocations one SIMD batch after another, each
        // through the whole run: runs must stay cache-sized, and workgroups cost more than on a
        // GPU. 64 measured best on lavapipe (5.7 GB/s over 16 M floats; 4: 1.4, 528: 4.2-5.0).
        let parts_cap = if device.adapter().is_some_and(|a| a.cpu_kernel_shapes) { CPU_PARTS } else { u64::MAX };
        // As many parts as PyTorch's blocks, as far as its buffer holds our accumulators (f32
        // where f16 max and min keep 2-byte ones there; i32 where 8-bit sums keep bytes).
        let split = split.and_then(|(s, buffer)| {
            let parts = s.ctas_per_output.min(buffer.storage.bytes / (spec.acc.size() as u64 * outputs)).min(parts_cap);
            (parts > 1).then(|| (parts as u32, buffer.reinterpret(spec.acc, (parts * outputs) as usize)))
        });
        let mut operands = vec![out, self];
        let mut names = vec![("out", out.dtype), ("a", self.dtype)];
        if let Some((_, part)) = &split {
            operands.push(part);
            names.push(("part", spec.acc));
        }
        let b = bind(&operands)?;
        // Whether the reduced elements of each output are consecutive (innermost first, each
        // reduced dimension's stride the product of the sizes inside it).
        let mut run = 1;
        let contiguous = dims.iter().rev().all(|&d| {
            let ok = self.shape()[d] == 1 || self.strides()[d] == run;
            run *= self.shape()[d];
            ok
        });
        let finish = spec.finish.replace("{T}", values(out.dtype, device)?.name());
        let lanes = reduction_lanes(n, contiguous, device.adapter().is_some_and(|a| a.cpu_kernel_shapes));
        let kernel = |family, entry| -> Result<Kernel> {
            Ok(Kernel::new(family, entry)
                .with("LANES", if family == Family::ReduceSplit { 256 } else { lanes.unwrap_or(256) }.to_string())
                .with_meta::<ReduceMeta>()
                .with_operands(device.native_f16(), &b.plan, &names)?
                .with("CONTIGUOUS", if contiguous { "true" } else { "false" })
                .with("ACC", values(spec.acc, device)?.name())
                .with("INIT", spec.init.clone())
                .with("STEP", spec.step.clone())
                .with("COMBINE", spec.combine.clone())
                .with("FINISH", finish.clone()))
        };
        // The reduced dimensions' sizes and input strides, innermost last.
        let (mut sizes, mut strides) = ([1; MAX_DIMS], [0; MAX_DIMS]);
        for (i, &d) in dims.iter().enumerate() {
            (sizes[i], strides[i]) = (self.shape()[d] as u32, self.strides()[d] as u32);
        }
        let meta = ReduceMeta {
            numel: outputs as u32,
            ndim: self.ndim() as u32,
            shape: shape_meta(out.shape()),
            out: strided(&out.layout, b.plan.base(0)),
            a: strided(&self.layout, b.plan.base(1)),
            reduced: dims.len() as u32,
            count: n as u32,
            sizes,
            strides,
            parts: split.as_ref().map_or(1, |s| s.0),
            part: if split.is_some() { b.plan.base(2) } else { 0 },
        };
        let per_workgroup = |groups: u64| Grid::Threads { threads: groups * 256, workgroup: 256 };
        match split {
            Some((parts, _)) => {
                device.launch(&kernel(Family::ReduceSplit, "reduce_split")?, &meta, &b, per_workgroup(outputs * parts as u64))?;
                device.launch(&kernel(Family::ReduceSplit, "reduce_parts")?, &meta, &b, per_workgroup(outputs))?;
            }
            None => match lanes {
                Some(lanes) => {
                    let groups = outputs.div_ceil(256 / lanes as u64);
                    device.launch(&kernel(Family::Reduce, "reduce_lanes")?, &meta, &b, per_workgroup(groups))?
                }
                None => device.launch(&kernel(Family::Reduce, "reduce")?, &meta, &b, Grid::Threads { threads: outputs, workgroup: WORKGROUP })?,
            },
        }
        Ok(())
    }

    fn reduction_spec(&self, op: Reduction) -> Result<ReductionSpec> {
        let t = values(self.dtype, self.device())?;
        let float = self.dtype.is_float();
        // Floats accumulate in f32 (f16 sums lose too much otherwise); integers in their type.
        let acc = if float { DType::F32 } else { self.dtype };
        let acc_type = if float { WgslScalar::F32 } else { t };
        let cast = |e: &str| format!("{acc_type}({e})");
        let (lowest, highest) = match self.dtype {
            DType::I32 => ("-2147483647 - 1", "2147483647"),
            DType::U32 => ("0u", "4294967295u"),
            // ±FLT_MAX by bits: a decimal literal may round past f32's range (Tint rejects it).
            _ => ("bitcast<f32>(0xff7fffffu)", "bitcast<f32>(0x7f7fffffu)"),
        };
        let add = || (format!("acc = acc + {};", cast("x")), "acc = acc + x;".to_string());
        let (name, init, (step, combine), finish) = match op {
            Reduction::Sum => ("sum", cast("0"), add(), "{T}(acc)"),
            Reduction::Mean if float => ("mean", cast("0"), add(), "{T}(acc / f32(n))"),
            Reduction::Mean => return Err(TensorError::DType(format!("mean of {} tensors: PyTorch requires a floating dtype", self.dtype))),
            Reduction::Max => ("max", cast(lowest), (format!("acc = max(acc, {});", cast("x")), "acc = max(acc, x);".into()), "{T}(acc)"),
            Reduction::Norm if float => {
                ("linalg_vector_norm", cast("0"), (format!("acc = acc + {} * {};", cast("x"), cast("x")), "acc = acc + x;".into()), "{T}(sqrt(acc))")
            }
            Reduction::Norm => return Err(TensorError::DType(format!("norm of {} tensors: PyTorch requires a floating dtype", self.dtype))),
            Reduction::Min => ("min", cast(highest), (format!("acc = min(acc, {});", cast("x")), "acc = min(acc, x);".into()), "{T}(acc)"),
        };
        Ok(ReductionSpec { name, acc, init, step, combine, finish })
    }

    /// `sum(dims, keepdim)`; empty `dims` reduces everything.
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        // On autocast's float32 list: an f16 input sums into a float32 result (no copy).
        let autocast_off = amp::fp32_output(self);
        let dtype = if autocast_off.is_some() { DType::F32 } else { self.dtype };
        self.sum_to_dtype(dims, keepdim, dtype)
    }

    /// `sum(dims, keepdim, dtype=...)`: the result in `dtype`. f16 and bf16 are read straight
    /// into a float32 result; other conversions copy the input first, as ATen's reductions do.
    #[track_caller]
    pub fn sum_to_dtype(&self, dims: &[isize], keepdim: bool, dtype: DType) -> Result<Tensor> {
        if dtype != self.dtype && !(matches!(self.dtype, DType::F16 | DType::BF16) && dtype == DType::F32) {
            return self.to(dtype)?.sum_to_dtype(dims, keepdim, dtype);
        }
        let out = self.reduce(dims, keepdim, Reduction::Sum, dtype)?;
        self.record_reduction(dims, keepdim, Reduction::Sum, out)
    }

    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let out = self.reduce(dims, keepdim, Reduction::Mean, self.dtype)?;
        self.record_reduction(dims, keepdim, Reduction::Mean, out)
    }

    /// `amax(dims, keepdim)`: maximum values.
    #[track_caller]
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        not_differentiated_yet("max", &[self])?;
        self.reduce(dims, keepdim, Reduction::Max, self.dtype)
    }

    #[track_caller]
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        not_differentiated_yet("min", &[self])?;
        self.reduce(dims, keepdim, Reduction::Min, self.dtype)
    }

    /// `linalg.vector_norm(self)`: the L2 norm of all elements, one scalar (what
    /// `clip_grad_norm_` computes per gradient). Not differentiated.
    #[track_caller]
    pub fn norm(&self) -> Result<Tensor> {
        not_differentiated_yet("norm", &[self])?;
        self.reduce(&[], false, Reduction::Norm, self.dtype)
    }

    /// Records sum or mean: they save only sizes. The gradient expands back over the reduced
    /// dimensions (a view: no memory for sum; mean then divides, which allocates).
    #[track_caller]
    fn record_reduction(&self, dims: &[isize], keepdim: bool, op: Reduction, out: Tensor) -> Result<Tensor> {
        if !graph::records(&[self]) {
            return Ok(out);
        }
        let name = match (op, dims.is_empty()) {
            (Reduction::Sum, true) => "SumBackward0",
            (Reduction::Sum, false) => "SumBackward1",
            (_, true) => "MeanBackward0",
            (_, false) => "MeanBackward1",
        };
        let input_shape = self.shape().to_vec();
        let reduced: Vec<usize> =
            if dims.is_empty() { (0..self.ndim()).collect() } else { dims.iter().map(|&d| wrap_dim(d, self.ndim())).collect::<Result<_>>()? };
        let kept: Vec<isize> = (0..self.ndim()).map(|d| if reduced.contains(&d) { 1 } else { input_shape[d] as isize }).collect();
        let count: usize = reduced.iter().map(|&d| input_shape[d]).product();
        Ok(graph::record(
            name,
            &[self],
            out,
            &[],
            Box::new(move |_, g| {
                let g = if keepdim { g.share() } else { g.reshape(&kept)? };
                let g = g.expand(&input_shape)?;
                Ok(vec![Some(if op == Reduction::Mean { g.div_scalar(count as f64)? } else { g })])
            }),
        ))
    }

    /// Whether `shape` broadcasts to this tensor's shape (`at::is_expandable_to`), so that
    /// `sum_to(shape)` undoes the broadcast.
    pub(crate) fn expands_from(&self, shape: &[usize]) -> bool {
        shape.len() <= self.ndim() && shape.iter().rev().zip(self.shape().iter().rev()).all(|(&s, &d)| s == d || s == 1)
    }

    /// The gradient of a broadcast operand: `self` summed back to `shape` (PyTorch's
    /// `sum_to`): over the leading dimensions `shape` lacks and those where it has 1. Self when
    /// nothing was broadcast.
    #[track_caller]
    pub(crate) fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.share());
        }
        let leading = self.ndim() - shape.len();
        let dims: Vec<isize> = (0..self.ndim()).filter(|&d| d < leading || (shape[d - leading] == 1 && self.shape()[d] != 1)).map(|d| d as isize).collect();
        let summed = if dims.is_empty() { self.share() } else { self.reduce(&dims, true, Reduction::Sum, self.dtype)? };
        // As `at::sum_to`: the keepdim sum is the result; only leading dimensions make a view.
        if leading == 0 {
            return Ok(summed);
        }
        summed.reshape(&shape.iter().map(|&n| n as isize).collect::<Vec<_>>())
    }
}
