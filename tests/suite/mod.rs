//! The op suite: every kernel against a plain-Rust reference on random shapes, strided views,
//! broadcasting, size-1 and zero-size dimensions. Each check is an async function of a device, run
//! natively on the first adapter (`tests/gpu_ops.rs`, lavapipe here) and in headless Chromium's
//! WebGPU (`tests/web.rs`), whose limits and features differ (no shader-f16, 256-byte offsets).
#![allow(dead_code)]

use tensormem::tensor::{Element, Layout};
use tensormem::{DType, Device, SimOptions, Tensor};

/// Calls `$run!` with the name of every check in this suite: each runner (native, browser)
/// turns them into tests, and a new check is listed once, here.
macro_rules! every_check {
    ($run:ident) => {
        $run!(
            long_programs_span_several_batches,
            a_segment_released_under_pending_work_stays_valid_for_it,
            upload_and_readback_round_trip,
            binary_ops_broadcast_over_strided_views,
            contiguous_float32_goes_four_elements_at_a_time,
            unary_and_scalar_ops_match_the_reference,
            in_place_ops_write_through_views_and_allocate_nothing,
            reductions_over_dims,
            long_reductions_split_as_pytorch_splits_them,
            contiguous_rows_reduce_with_neighbours_reading_neighbours,
            matmul_variants_match_the_reference,
            matmul_kernels_are_chosen_per_class_of_shapes,
            float16,
            bfloat16,
            exact_memory_facts,
            a_freed_block_reused_for_an_upload_does_not_corrupt_pending_work,
            operands_in_one_segment_bind_without_validation_errors,
            clear_errors_for_bad_input,
            comparisons_where_casts_and_addcmul,
            softmax_layer_norm_var_argmax,
            cat_stack_index_select_embedding_and_random,
            zero_size_and_size_one_dimensions,
            the_sim_device_records_the_same_trace_as_the_gpu,
            the_sim_device_answers_as_the_gpu,
            matmul_allocates_what_aten_allocates,
            gradients_match_finite_differences,
            a_training_step_allocates_on_the_gpu_as_on_the_sim_device,
            autocast_mixed_types_and_the_grad_scaler,
            graphs_and_mem_pools_allocate_from_pools_of_their_own
        );
    };
}
pub(crate) use every_check;

pub async fn read<T: Element>(t: &Tensor) -> Vec<T> {
    t.to_vec::<T>().await.unwrap()
}

/// Deterministic pseudo-random numbers (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (self.next() % 20_000) as f32 / 10_000.0 - 1.0).collect()
    }
    fn shape(&mut self, ndim: usize) -> Vec<usize> {
        (0..ndim).map(|_| 1 + self.below(5)).collect()
    }
}

/// The logical elements of a layout over `base`, row-major: what a correct kernel reads.
fn gather<T: Copy>(base: &[T], layout: &Layout) -> Vec<T> {
    let n = layout.numel();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut rem = i;
        let mut off = layout.offset;
        for d in (0..layout.ndim()).rev() {
            off += (rem % layout.shape[d]) * layout.strides[d];
            rem /= layout.shape[d];
        }
        out.push(base[off]);
    }
    out
}

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs());
        assert!(ok, "{what}: element {i}: got {x}, expected {y}");
    }
}

/// A random view of a fresh tensor: transposed, narrowed or plain. Returns it with its base data.
fn random_view(dev: &Device, rng: &mut Rng, shape: &[usize]) -> (Tensor, Vec<f32>) {
    match rng.below(3) {
        0 if shape.len() >= 2 => {
            // Build the transposed shape, then transpose back: same logical shape, swapped strides.
            let mut s = shape.to_vec();
            let n = s.len();
            s.swap(n - 1, n - 2);
            let data = rng.f32s(s.iter().product());
            let t = dev.from_slice(&data, &s).unwrap().transpose(-1, -2).unwrap();
            (t, data)
        }
        1 => {
            // A narrowed slice of a larger tensor along dim 0.
            let mut s = shape.to_vec();
            s[0] += 2;
            let data = rng.f32s(s.iter().product());
            let t = dev.from_slice(&data, &s).unwrap().narrow(0, 1, shape[0]).unwrap();
            (t, data)
        }
        _ => {
            let data = rng.f32s(shape.iter().product());
            (dev.from_slice(&data, shape).unwrap(), data)
        }
    }
}

/// Allocations made on `dev` so far (`memory_stats()["allocation.all.allocated"]`).
fn allocations(dev: &Device) -> i64 {
    dev.memory_stats()["allocation.all.allocated"]
}

fn reference_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

/// Requested bytes of each allocation `dev` makes while `f` runs.
/// Runs a matmul forward and backward, so that cuBLAS's workspaces (the main thread's and
/// autograd's: made by the first matmul on each, and kept) exist before a test counts what an
/// op allocates.
fn make_cublas_workspaces(dev: &Device) {
    let w = dev.ones(&[2, 2], DType::F32).unwrap();
    w.requires_grad_(true).unwrap();
    w.matmul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
}

fn allocations_during<T>(dev: &Device, f: impl FnOnce() -> T) -> (T, Vec<u64>) {
    let before = dev.snapshot().device_traces[0].len();
    let out = f();
    let sizes = dev.snapshot().device_traces[0].range(before..).filter(|e| e.action == tensormem::trace::Action::Alloc).map(|e| e.size).collect();
    (out, sizes)
}

mod matmul;
mod memory;
mod ops;
mod training;
pub use matmul::*;
pub use memory::*;
pub use ops::*;
pub use training::*;
