//! The simulation device's settings: the card being simulated, its memory and its speed.

use super::CudaCard;
use crate::cards;

/// A card's published peak speeds: the sim device's modelled clock charges each op by them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speed {
    /// Memory bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Dense f32 FLOP/s on the ordinary cores (no tensor cores, no TF32).
    pub f32_flops: f64,
    /// Dense f16/bf16 FLOP/s (tensor cores with f32 accumulation where the card has them).
    pub half_flops: f64,
}

impl Speed {
    /// One op's modelled time in microseconds, a roofline: bound by memory (`bytes` read and
    /// written over the bandwidth) or by compute (`flops` at the peak rate of its precision),
    /// whichever takes longer. Peak figures, so a lower bound: real kernels reach less.
    pub fn op_time_us(&self, bytes: u64, flops: u64, half: bool) -> f64 {
        let peak = if half { self.half_flops } else { self.f32_flops };
        (bytes as f64 / self.bandwidth).max(flops as f64 / peak) * 1e6
    }
}

/// NVIDIA H100 SXM5: 3.35 TB/s HBM3, 67 TFLOP/s f32, 989.4 TFLOP/s dense bf16 (H100 datasheet
/// and Hopper whitepaper). Also the speed (and multiprocessors) of custom sizes and of budgets
/// that are no card.
const H100: Speed = Speed { bandwidth: 3.35e12, f32_flops: 67e12, half_flops: 989.4e12 };

/// Name and memory (`crate::cards`: as `torch.cuda.get_device_properties().total_memory`
/// reports it), speed and multiprocessors. Sources: NVIDIA's
/// datasheets (A100: SXM4 figures; L4's and H100's bf16 are the dense halves of their "with
/// sparsity" figures), the Ada Lovelace whitepaper for the RTX 4090 (bf16 with f32
/// accumulation), Apple's M2 announcement (100 GB/s, 3.6 TFLOP/s; no separate f16 figure is
/// published). The H200 is the H100's chip (132 SMs, compute capability 9.0) with 4.8 TB/s of
/// HBM3e (H200 datasheet; the card lent on 2026-11-28 reported the same SMs and capability).
/// The cards people rent (memory and SMs: `crate::cards`): leads from NVIDIA's datasheets,
/// HGX B200 (8 TB/s, 600 TFLOP/s f32 and 36 PFLOP/s sparse bf16 for eight: 75 and 2,250 dense
/// each), L40S (864 GB/s, 91.6, 362.05 dense bf16), A10 (600 GB/s, 31.2, 125), RTX A6000
/// (768 GB/s, 38.7, 154.8), and the Ampere GA102 and Blackwell GB202 whitepapers for the RTX
/// 3090 (936 GB/s, 35.6, 71 with f32 accumulation) and 5090 (1,792 GB/s, 104.8, 209.5); threads
/// per SM by compute capability (1,536 on 8.6, 8.9 and 12.0, 2,048 on 10.0).
/// T4 has no bf16 tensor cores: its f16 figure stands in. SM counts from the same
/// documents; threads per SM from CUDA's compute capability table (2,048 on 8.0 and 9.0, 1,536
/// on 8.9, 1,024 on 7.5), and each card's compute capability from the same table (it sizes
/// cuBLAS's workspaces). The M2 runs PyTorch's MPS backend, whose reductions allocate nothing
/// of this kind; the browser budget models what a GPU device models.
/// The MI300X (AMD's datasheet: 5.3 TB/s, 81.7 TFLOP/s f32 vector, 1,307.4 dense bf16) is a
/// ROCm card: gfx942 (9.4), 304 compute units of 2,048 work-items, wavefronts of 64 (rocminfo
/// in github.com/ROCm/rocprofiler-sdk/issues/76), hipBLAS's workspaces.
const CARDS: [(&str, u64, Speed, Option<CudaCard>); 16] = [
    (cards::H100_80GB.0, cards::H100_80GB.1, H100, Some(H100_CARD)),
    (cards::H200_141GB.0, cards::H200_141GB.1, Speed { bandwidth: 4.8e12, ..H100 }, Some(H100_CARD)),
    (cards::A100_80GB.0, cards::A100_80GB.1, Speed { bandwidth: 2.039e12, f32_flops: 19.5e12, half_flops: 312e12 }, Some(A100_CARD)),
    (cards::A100_40GB.0, cards::A100_40GB.1, Speed { bandwidth: 1.555e12, f32_flops: 19.5e12, half_flops: 312e12 }, Some(A100_CARD)),
    (cards::RTX4090_24GB.0, cards::RTX4090_24GB.1, Speed { bandwidth: 1.008e12, f32_flops: 82.6e12, half_flops: 165.2e12 }, Some(card(128, 1536, (8, 9)))),
    (cards::L4_24GB.0, cards::L4_24GB.1, Speed { bandwidth: 300e9, f32_flops: 30.3e12, half_flops: 121e12 }, Some(card(58, 1536, (8, 9)))),
    (cards::T4_16GB.0, cards::T4_16GB.1, Speed { bandwidth: 320e9, f32_flops: 8.1e12, half_flops: 65e12 }, Some(card(40, 1024, (7, 5)))),
    (cards::B200_180GB.0, cards::B200_180GB.1, Speed { bandwidth: 8e12, f32_flops: 75e12, half_flops: 2.25e15 }, Some(card(148, 2048, (10, 0)))),
    (cards::L40S_48GB.0, cards::L40S_48GB.1, Speed { bandwidth: 864e9, f32_flops: 91.6e12, half_flops: 362.05e12 }, Some(card(142, 1536, (8, 9)))),
    (cards::A10_24GB.0, cards::A10_24GB.1, Speed { bandwidth: 600e9, f32_flops: 31.2e12, half_flops: 125e12 }, Some(card(72, 1536, (8, 6)))),
    (cards::RTX_A6000_48GB.0, cards::RTX_A6000_48GB.1, Speed { bandwidth: 768e9, f32_flops: 38.7e12, half_flops: 154.8e12 }, Some(card(84, 1536, (8, 6)))),
    (cards::RTX3090_24GB.0, cards::RTX3090_24GB.1, Speed { bandwidth: 936e9, f32_flops: 35.6e12, half_flops: 71e12 }, Some(card(82, 1536, (8, 6)))),
    (cards::RTX5090_32GB.0, cards::RTX5090_32GB.1, Speed { bandwidth: 1.792e12, f32_flops: 104.8e12, half_flops: 209.5e12 }, Some(card(170, 1536, (12, 0)))),
    (cards::MI300X_192GB.0, cards::MI300X_192GB.1, Speed { bandwidth: 5.3e12, f32_flops: 81.7e12, half_flops: 1307.4e12 }, Some(MI300X_CARD)),
    (cards::M2_16GB_UNIFIED.0, cards::M2_16GB_UNIFIED.1, Speed { bandwidth: 100e9, f32_flops: 3.6e12, half_flops: 3.6e12 }, None),
    (cards::BROWSER_2GB.0, cards::BROWSER_2GB.1, H100, Some(H100_CARD)),
];

const A100_CARD: CudaCard = card(108, 2048, (8, 0));

const MI300X_CARD: CudaCard =
    CudaCard { multiprocessors: Multiprocessors { count: 304, max_threads_each: 32 * 64, warp_size: 64 }, capability: (9, 4), rocm: true };

/// An NVIDIA card: warps of 32 threads.
const fn card(count: u32, max_threads_each: u32, capability: (u32, u32)) -> CudaCard {
    CudaCard { multiprocessors: Multiprocessors { count, max_threads_each, warp_size: 32 }, capability, rocm: false }
}

/// The presets' names and memory (the page lists these pairs).
pub const PRESETS: [(&str, u64); CARDS.len()] = {
    let mut out = [("", 0); CARDS.len()];
    let mut i = 0;
    while i < CARDS.len() {
        out[i] = (CARDS[i].0, CARDS[i].1);
        i += 1;
    }
    out
};

/// A card's memory as the command line and the page take it: a preset's name (`H100-80GB`,
/// case-insensitive, `sim:` allowed before it) or a size (`80GiB`, `24GB`, bytes).
pub fn parse_capacity(text: &str) -> Result<u64, String> {
    let name = text.trim();
    let name = name.strip_prefix("sim:").unwrap_or(name);
    if let Some(card) = SimOptions::find(name) {
        return Ok(card.capacity);
    }
    crate::report::parse_size(name).map_err(|e| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
        format!("{e}, or a card: {}", names.join(", "))
    })
}

/// What ATen reads from `cudaDeviceProp` to size a reduction's grid (see
/// `tensor::ops::cuda_reduce`): a long reduction is split over more blocks on a bigger card,
/// and the split allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Multiprocessors {
    /// `multiProcessorCount`.
    pub count: u32,
    /// `maxThreadsPerMultiProcessor`.
    pub max_threads_each: u32,
    /// `warpSize`: 32 on NVIDIA cards, 64 (a wavefront) on AMD's CDNA cards.
    pub warp_size: u32,
}

/// The H100 SXM5's 132 SMs of 2,048 threads: also what GPU devices model by default.
pub const H100_MULTIPROCESSORS: Multiprocessors = Multiprocessors { count: 132, max_threads_each: 2048, warp_size: 32 };

/// The H100 SXM5 as ATen sees it: 132 SMs, compute capability 9.0.
pub const H100_CARD: CudaCard = CudaCard { multiprocessors: H100_MULTIPROCESSORS, capability: (9, 0), rocm: false };

#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    pub name: String,
    /// Device memory in bytes.
    pub capacity: u64,
    pub speed: Speed,
    /// The CUDA card's properties, which decide how PyTorch splits long reductions (and what
    /// the split allocates) and how big cuBLAS's workspaces are; None for a card whose backend
    /// is not CUDA (no split reductions, no workspaces).
    pub cuda: Option<CudaCard>,
    /// `CUBLAS_WORKSPACE_CONFIG`'s size per handle in bytes (see
    /// [`super::cublas::parse_workspace_config`]); None: PyTorch's default for the card.
    pub cublas_workspace: Option<u64>,
}

impl SimOptions {
    /// A preset by name (case-insensitive); unknown names fall back to a custom-named 80 GiB card.
    pub fn preset(name: &str) -> SimOptions {
        SimOptions::find(name).unwrap_or(SimOptions { name: name.to_string(), ..SimOptions::custom(80 << 30) })
    }

    pub fn find(name: &str) -> Option<SimOptions> {
        CARDS.iter().find(|(n, ..)| n.eq_ignore_ascii_case(name)).map(|&(n, capacity, speed, cuda)| SimOptions {
            name: n.to_string(),
            capacity,
            speed,
            cuda,
            cublas_workspace: None,
        })
    }

    pub fn custom(capacity: u64) -> SimOptions {
        SimOptions { name: format!("custom {}", crate::alloc::format_size(capacity)), capacity, speed: H100, cuda: Some(H100_CARD), cublas_workspace: None }
    }

    /// The device's name: `sim (H100-80GB)`.
    pub fn device_name(&self) -> String {
        format!("sim ({})", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every NVIDIA card the doctor may name is a preset `sim:NAME` runs, with the same memory
    /// and CUDA's properties.
    #[test]
    fn every_cuda_card_is_a_preset() {
        for (name, bytes) in cards::CUDA_CARDS {
            let sim = SimOptions::find(name).unwrap_or_else(|| panic!("{name} is no preset"));
            assert_eq!(sim.capacity, bytes, "{name}");
            assert!(sim.cuda.is_some(), "{name}");
        }
    }
}
