//! PyTorch's CUDA reduction launch (ATen's `setReduceConfig` in `Reduce.cuh`) as far as memory
//! goes. A long reduction into few outputs is split across thread blocks; ATen then takes a
//! global-memory buffer for the blocks' partial results and one semaphore per column of output
//! blocks from the caching allocator, and frees both right after the launch. A snapshot shows
//! them: `x.sum()` of 2^19 floats allocates 256 bytes, then 4 (the fixture `small-state`). So
//! both devices make the same two allocations, and the GPU device's split kernel keeps its
//! partial results in that buffer.
//!
//! How many blocks depends on the card (`multiProcessorCount`, `maxThreadsPerMultiProcessor`,
//! `warpSize`) and on how ATen's TensorIterator orders and merges the dimensions, which is
//! modelled here too. PyTorch's ROCm build adjusts `setReduceConfig` under `USE_ROCM` (followed
//! from github.com/ROCm/pytorch at ee51720, the ROCm team's tree; not checked on an AMD card):
//! input vectors from 128 elements on, two-dimensional reductions on small cards split outputs
//! rather than inputs, the threads counted per multiprocessor depend on the iterator's dimensions
//! (unless the grid is one block wide), the blocks per output are rounded to the
//! multiprocessors, and a three-dimensional reduction across the slow dimensions takes four
//! blocks per output or more.

use crate::device::CudaCard;

/// A reduction as ATen sees it: the input's shape and strides (elements), which dimensions are
/// reduced, where the input starts (its address over its element size: vector loads need
/// alignment), and the accumulator's size (`arg_t`).
pub(crate) struct ReductionLaunch<'a> {
    pub shape: &'a [usize],
    pub strides: &'a [usize],
    pub reduced: &'a [bool],
    pub input_index: u64,
    pub acc_size: u64,
}

/// A reduction split across blocks: the blocks per output and the two allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GlobalReduce {
    pub ctas_per_output: u64,
    pub buffer_bytes: u64,
    pub semaphore_bytes: u64,
}

/// ATen's `ReduceConfig::MAX_NUM_THREADS` (all but complex double), the vector width
/// of loads (`input_vec_size`, and the widest `output_vec_size`; every reduction modelled has
/// `vt0` 4, so input vectors are allowed), and the values a thread should keep.
const MAX_NUM_THREADS: i64 = 512;
const VEC_SIZE: i64 = 4;
const MIN_VALUES_PER_THREAD: i64 = 16;
const MAX_VALUES_PER_THREAD: i64 = 256;

/// One dimension of the iterator: size and strides (elements) of the output and the input.
#[derive(Debug, Clone, Copy, PartialEq)]
struct IterDim {
    size: i64,
    out: i64,
    input: i64,
}

/// TensorIterator's dimensions for a reduction: fastest first, reduced ones (output stride 0)
/// in front, then merged where both operands run on (`reorder_dimensions`,
/// `coalesce_dimensions`).
fn iterator_dims(shape: &[usize], strides: &[usize], reduced: &[bool]) -> Vec<IterDim> {
    // The output is contiguous over the input's shape with the reduced dimensions at 1; its
    // reduced dimensions get stride 0.
    let mut out_strides = vec![0i64; shape.len()];
    let mut run = 1i64;
    for d in (0..shape.len()).rev() {
        out_strides[d] = if reduced[d] && shape[d] != 1 { 0 } else { run };
        if !reduced[d] {
            run *= shape[d] as i64;
        }
    }
    // The permutation starts reversed (last dimension fastest), then an insertion sort that
    // only moves a dimension past one it must follow.
    let mut dims: Vec<IterDim> = (0..shape.len()).rev().map(|d| IterDim { size: shape[d] as i64, out: out_strides[d], input: strides[d] as i64 }).collect();
    let should_swap = |a: IterDim, b: IterDim| -> i32 {
        for (s0, s1, is_output) in [(a.out, b.out, true), (a.input, b.input, false)] {
            if is_output && (s0 == 0) != (s1 == 0) {
                return if s1 == 0 { 1 } else { -1 };
            }
            if s0 == 0 || s1 == 0 {
                continue;
            }
            if s0 != s1 {
                return if s0 < s1 { -1 } else { 1 };
            }
            if a.size > b.size {
                return 1;
            }
        }
        0
    };
    for i in 1..dims.len() {
        let mut moving = i;
        for earlier in (0..i).rev() {
            match should_swap(dims[earlier], dims[moving]) {
                c if c > 0 => {
                    dims.swap(earlier, moving);
                    moving = earlier;
                }
                c if c < 0 => break,
                _ => {}
            }
        }
    }
    // Merge a dimension into the previous one where every operand's strides run on.
    let mut merged: Vec<IterDim> = Vec::with_capacity(dims.len());
    for dim in dims {
        match merged.last_mut() {
            Some(prev) if prev.size == 1 || dim.size == 1 || (prev.size * prev.out == dim.out && prev.size * prev.input == dim.input) => {
                if prev.size == 1 {
                    (prev.out, prev.input) = (dim.out, dim.input);
                }
                prev.size *= dim.size;
            }
            _ => merged.push(dim),
        }
    }
    merged
}

fn div_up(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// The largest power of two at most `n` (at least 1), ATen's `last_pow2`.
fn last_pow2(n: i64) -> i64 {
    if n < 1 { 1 } else { 1 << (63 - n.leading_zeros()) }
}

/// ATen's `get_output_vec_size`: 4, halved until the input's start, the output dimension's size
/// and every other input stride divide by it.
fn output_vec_size(dims: &[IterDim], output_index: usize, input_index: u64) -> i64 {
    let mut vec = VEC_SIZE;
    let mut fit = |n: u64| {
        while !n.is_multiple_of(vec as u64) {
            vec /= 2;
        }
    };
    fit(input_index);
    fit(dims[output_index].size as u64);
    for (j, d) in dims.iter().enumerate() {
        if j != output_index {
            fit(d.input as u64);
        }
    }
    vec
}

/// Whether ATen splits this reduction across blocks on a card with these multiprocessors, and
/// what it then allocates. None: one block per output (group), nothing allocated.
pub(crate) fn global_reduce(launch: &ReductionLaunch, card: CudaCard) -> Option<GlobalReduce> {
    let mp = card.multiprocessors;
    let dims = iterator_dims(launch.shape, launch.strides, launch.reduced);
    let num_outputs: i64 = dims.iter().filter(|d| d.out != 0).map(|d| d.size).product();
    let numel: i64 = dims.iter().map(|d| d.size).product();
    if numel == 0 {
        return None;
    }
    let inputs_per_output = numel / num_outputs;
    let reduce_dims = dims.iter().filter(|d| d.out == 0).count();
    let (on_fastest, fastest_stride, mut dim0, dim1) = if dims.is_empty() {
        (true, 1, 1, 1)
    } else {
        let on_fastest = reduce_dims == dims.len() || dims[0].input < dims[reduce_dims].input;
        if on_fastest { (true, dims[0].input, inputs_per_output, num_outputs) } else { (false, dims[reduce_dims].input, num_outputs, inputs_per_output) }
    };
    // Vector loads along the reduced dimension, or along the outputs.
    let mut out_vec = 1;
    if fastest_stride == 1 {
        let long_enough = if card.rocm { dim0 >= 128 } else { dim0 > 128 };
        if on_fastest && long_enough && reduce_dims == 1 {
            dim0 /= VEC_SIZE;
        } else if !on_fastest {
            out_vec = output_vec_size(&dims, reduce_dims, launch.input_index);
            dim0 /= out_vec;
        }
    }
    // set_block_dimension.
    let max_threads = MAX_NUM_THREADS / out_vec;
    let pow2 = |n: i64| if n < max_threads { last_pow2(n) } else { max_threads };
    let (dim0_pow2, dim1_pow2) = (pow2(dim0), pow2(dim1));
    let block_height = dim1_pow2.min(max_threads / dim0_pow2.min(mp.warp_size as i64));
    let block_width = dim0_pow2.min(max_threads / block_height);
    let num_threads = block_width * block_height;
    // Lanes split the input (reducing along the fastest dimension) or the outputs; then warps
    // split the input if each thread keeps enough values.
    let (mut step_input, mut step_output) = (1i64, 1i64);
    let block_x_reduce = dims.is_empty() || on_fastest;
    if block_x_reduce {
        step_input *= block_width;
    } else {
        step_output *= block_width;
    }
    let values_per_thread = |step_input: i64| div_up(inputs_per_output, step_input);
    let ndim = dims.len();
    let rocm_splits_outputs = card.rocm && ndim == 2 && on_fastest && values_per_thread(step_input) < 1024 && mp.count < 100;
    let block_y_reduce = !rocm_splits_outputs && values_per_thread(step_input) >= (block_height * 16).min(MAX_VALUES_PER_THREAD);
    if block_y_reduce {
        step_input *= block_height;
    } else {
        step_output *= block_height;
    }
    let grid_x = div_up(num_outputs / out_vec, step_output);
    // (ROCm's test, `grid().x == grid().y == grid().z == 1` in C++, holds when x is 1.)
    let single_block = grid_x == 1;
    let threads_per_mp = match (card.rocm && !single_block, ndim) {
        (true, 1 | 3) => 512,
        (true, 2) => 256,
        _ => mp.max_threads_each as i64,
    };
    let blocks_per_sm = threads_per_mp / num_threads;
    let num_mp = mp.count as i64;
    let target_grid = num_mp * blocks_per_sm;
    let vpt = values_per_thread(step_input);
    if !block_y_reduce || vpt < MAX_VALUES_PER_THREAD || grid_x > target_grid {
        return None;
    }
    let mut ctas = div_up(target_grid, grid_x).min(div_up(vpt, MIN_VALUES_PER_THREAD)).max(div_up(vpt, MAX_VALUES_PER_THREAD));
    if card.rocm {
        // At most the multiprocessors (two or four times as many on a card with fewer than
        // 128), half of them for middling splits, and none below 16 blocks.
        ctas = if ctas > num_mp {
            if num_mp < 128 { num_mp * if ctas > 512 { 4 } else { 2 } } else { num_mp }
        } else if ctas > div_up(num_mp, 2) {
            div_up(num_mp, 2)
        } else if ctas < 16 {
            1
        } else {
            ctas
        };
        // Across the slower dimensions of a three-dimensional iterator (not channels-last):
        // four blocks per output, doubled while a thread would keep 2,048 values or more.
        if ndim == 3 && !on_fastest && !channels_last(launch.shape, launch.strides) {
            ctas = 4;
            let mut kept = vpt;
            while kept >= 2048 {
                ctas *= 2;
                kept = values_per_thread(step_input * ctas);
            }
        }
    }
    if ctas <= 1 {
        return None;
    }
    let mut buffer = launch.acc_size as i64 * num_outputs * ctas;
    if !block_x_reduce {
        buffer *= block_width * out_vec;
    }
    Some(GlobalReduce { ctas_per_output: ctas as u64, buffer_bytes: buffer as u64, semaphore_bytes: 4 * grid_x as u64 })
}

/// `is_contiguous(at::MemoryFormat::ChannelsLast)`: a 4-d tensor laid out as NHWC (dimensions
/// of size 1 take any stride).
fn channels_last(shape: &[usize], strides: &[usize]) -> bool {
    if shape.len() != 4 {
        return false;
    }
    let mut expected = 1;
    for d in [1, 3, 2, 0] {
        if shape[d] != 1 {
            if strides[d] != expected {
                return false;
            }
            expected *= shape[d];
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::device::Multiprocessors;

    const fn nvidia(count: u32, max_threads_each: u32) -> CudaCard {
        CudaCard { multiprocessors: Multiprocessors { count, max_threads_each, warp_size: 32 }, capability: (8, 0), rocm: false }
    }
    const H100: CudaCard = nvidia(132, 2048);
    const A100: CudaCard = nvidia(108, 2048);

    fn contiguous(shape: &[usize]) -> Vec<usize> {
        let mut strides = vec![1; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        strides
    }

    fn f32_reduction(shape: &[usize], reduced: &[usize], card: CudaCard) -> Option<GlobalReduce> {
        let strides = contiguous(shape);
        let mask: Vec<bool> = (0..shape.len()).map(|d| reduced.contains(&d)).collect();
        global_reduce(&ReductionLaunch { shape, strides: &strides, reduced: &mask, input_index: 0, acc_size: 4 }, card)
    }

    #[test]
    fn whole_tensor_sums_split_as_the_real_snapshots_show() {
        // small-state.pickle: `loss = out.sum()` of 524,288 floats allocates 256 then 4 bytes.
        assert_eq!(f32_reduction(&[512, 1024], &[0, 1], H100), Some(GlobalReduce { ctas_per_output: 64, buffer_bytes: 256, semaphore_bytes: 4 }));
        // eor-nn-legacy: `.mean()` of 1,966,080 floats allocates 576 then 4 on its card, whose
        // 144 blocks in flight (e.g. 72 SMs of 1,024 threads) cap the split.
        let card = nvidia(72, 1024);
        assert_eq!(f32_reduction(&[10, 3, 256, 256], &[0, 1, 2, 3], card), Some(GlobalReduce { ctas_per_output: 144, buffer_bytes: 576, semaphore_bytes: 4 }));
        // 16 M floats on an A100: 108 SMs x 4 blocks of 512 threads.
        assert_eq!(f32_reduction(&[1 << 24], &[0], A100), Some(GlobalReduce { ctas_per_output: 432, buffer_bytes: 1728, semaphore_bytes: 4 }));
    }

    #[test]
    fn rocm_counts_threads_by_dimensions_and_rounds_blocks_to_the_multiprocessors() {
        let mi300x = CudaCard { multiprocessors: Multiprocessors { count: 304, max_threads_each: 2048, warp_size: 64 }, capability: (9, 4), rocm: true };
        // A whole-tensor sum: 512 threads per compute unit on ROCm, 64 blocks as on the H100.
        assert_eq!(f32_reduction(&[512, 1024], &[0, 1], mi300x), Some(GlobalReduce { ctas_per_output: 64, buffer_bytes: 256, semaphore_bytes: 4 }));
        // 16 M floats, a grid one block wide: all 2,048 threads counted, 1,216 blocks wanted,
        // rounded down to the 304 compute units (CUDA's rules would keep 1,216).
        assert_eq!(f32_reduction(&[1 << 24], &[0], mi300x), Some(GlobalReduce { ctas_per_output: 304, buffer_bytes: 1216, semaphore_bytes: 4 }));
        let as_cuda = CudaCard { rocm: false, ..mi300x };
        assert_eq!(f32_reduction(&[1 << 24], &[0], as_cuda).unwrap().ctas_per_output, 1216);
        // A three-dimensional reduction across the slow dimensions ([8, 2048, 64].sum(1): two
        // column blocks of 64 lanes x 4 outputs, 512 threads per unit): four blocks per output
        // instead of 64; eight once a thread would keep 2,048 values or more.
        assert_eq!(
            f32_reduction(&[8, 2048, 64], &[1], mi300x),
            Some(GlobalReduce { ctas_per_output: 4, buffer_bytes: 4 * 512 * 4 * 64 * 4, semaphore_bytes: 8 })
        );
        assert_eq!(f32_reduction(&[8, 16384, 64], &[1], mi300x).unwrap().ctas_per_output, 8);
        // Column sums: wavefronts of 64 lanes (3 column blocks, not 6), 256 threads per compute
        // unit for a two-dimensional iterator, 203 blocks wanted, 152 taken.
        assert_eq!(
            f32_reduction(&[8192, 768], &[0], mi300x),
            Some(GlobalReduce { ctas_per_output: 152, buffer_bytes: 4 * 768 * 152 * 64 * 4, semaphore_bytes: 12 })
        );
    }

    #[test]
    fn short_reductions_stay_in_one_block() {
        // A thread keeps fewer than 256 values up to 512 x 255 inputs per output.
        assert_eq!(f32_reduction(&[130_560], &[0], H100), None);
        assert!(f32_reduction(&[130_561], &[0], H100).is_some());
        // Rows of a [512, 10000] (the recorded training run's log_softmax sums): no split.
        assert_eq!(f32_reduction(&[512, 10_000], &[1], H100), None);
        // A norm weight's gradient over 512 tokens (gpt-medium-ctx128-training): no split.
        assert_eq!(f32_reduction(&[4, 128, 1024], &[0, 1], H100), None);
    }

    #[test]
    fn column_sums_allocate_per_lane_and_vector() {
        // [8192, 768].sum(0) on an A100: 6 column blocks of 32 lanes x 4 outputs, each split
        // over 128 blocks; the buffer counts every output once per lane and vector slot.
        assert_eq!(
            f32_reduction(&[8192, 768], &[0], A100),
            Some(GlobalReduce { ctas_per_output: 128, buffer_bytes: 4 * 768 * 128 * 32 * 4, semaphore_bytes: 24 })
        );
    }

    #[test]
    fn the_iterator_orders_reduced_dimensions_first_and_merges_runs() {
        let dims = |shape: &[usize], reduced: &[usize]| {
            let mask: Vec<bool> = (0..shape.len()).map(|d| reduced.contains(&d)).collect();
            iterator_dims(shape, &contiguous(shape), &mask).iter().map(|d| (d.size, d.out == 0, d.input)).collect::<Vec<_>>()
        };
        assert_eq!(dims(&[300, 200], &[0, 1]), [(60_000, true, 1)]);
        assert_eq!(dims(&[8192, 768], &[0]), [(8192, true, 768), (768, false, 1)]);
        assert_eq!(dims(&[4, 128, 1024], &[0, 1]), [(512, true, 1024), (1024, false, 1)]);
        assert_eq!(dims(&[2, 3, 4], &[1]), [(3, true, 4), (4, false, 1), (2, false, 12)]);
        assert_eq!(dims(&[1, 5], &[0]), [(5, false, 1)]);
    }
}
