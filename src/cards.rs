//! The cards tensormem knows by name, with their memory as PyTorch reports it
//! (`torch.cuda.get_device_properties().total_memory`: a little under the marketing size, the
//! driver keeps some). Plain data at the bottom of the layers: the sim device adds each card's
//! speed and CUDA properties (`device::sim`), and the doctor names the smallest card that holds
//! what a trace needs.

pub const H100_80GB: (&str, u64) = ("H100-80GB", 85_045_379_072);
/// Measured on a lent H200 (SXM, driver 580.159.04, PyTorch 2.11.0+cu130) on 2026-11-28:
/// 139.8 GiB of the 141 GB sold.
pub const H200_141GB: (&str, u64) = ("H200-141GB", 150_109_880_320);
pub const A100_80GB: (&str, u64) = ("A100-80GB", 85_051_572_224);
pub const A100_40GB: (&str, u64) = ("A100-40GB", 42_505_273_344);
pub const RTX4090_24GB: (&str, u64) = ("RTX4090-24GB", 25_386_352_640);
pub const L4_24GB: (&str, u64) = ("L4-24GB", 23_580_639_232);
pub const T4_16GB: (&str, u64) = ("T4-16GB", 15_828_320_256);

// Cards people rent, from what others printed on them (total_memory moves by up to ~200 MiB
// with the driver and ECC: the figure of one machine each). Where the source is PyTorch's
// `_CudaDeviceProperties` repr, which prints whole MiB rounded down, the bytes are those MiB.

/// B200 (the 180 GB part): repr `total_memory=182642MB, multi_processor_count=148`, major 10
/// (github.com/ai-bot-pro/achatbot, deploy/modal/src/llm/vllm/vlm/skywork_r1v.py).
pub const B200_180GB: (&str, u64) = ("B200-180GB", 182_642 << 20);
/// L40S: deviceQuery `45373 MBytes (47576711168 bytes)`, 142 SMs, 8.9
/// (github.com/alvarobartt/cuda-device-query, README.md).
pub const L40S_48GB: (&str, u64) = ("L40S-48GB", 47_576_711_168);
/// A10: deviceQuery `21.99 GBytes (23609475072 bytes)`, 8.6 (github.com/aalanwyr/face2cuda,
/// step2cuda/README.md); 72 SMs (NVIDIA A10 datasheet).
pub const A10_24GB: (&str, u64) = ("A10-24GB", 23_609_475_072);
/// RTX A6000: repr `total_memory=48676MB, multi_processor_count=84`, 8.6
/// (github.com/pytorch/ao, torchao/prototype/hqq/README.md).
pub const RTX_A6000_48GB: (&str, u64) = ("RTX-A6000-48GB", 48_676 << 20);
/// RTX 3090: deviceQuery `24268 MBytes (25447170048 bytes)`, 82 SMs, 8.6
/// (github.com/catid/blog2022, content/posts/jax.md); the same 24268 MiB in transformers'
/// docs/source/en/debugging.md.
pub const RTX3090_24GB: (&str, u64) = ("RTX3090-24GB", 25_447_170_048);
/// RTX 5090: deviceQuery `32120 MBytes (33680457728 bytes)`, 170 SMs, 12.0
/// (github.com/NVIDIA/nccl/issues/1637).
pub const RTX5090_32GB: (&str, u64) = ("RTX5090-32GB", 33_680_457_728);
/// AMD Instinct MI300X (ROCm, which runs the same caching allocator): repr
/// `total_memory=196592MB, multi_processor_count=304`, `gcnArchName='gfx942:sramecc+:xnack-'`,
/// major 9, minor 4, with PyTorch 2.6 (github.com/ROCm/ROCm/issues/4203); rocminfo's GPU
/// pool `201310208(0xbffc000) KB` is the same 196,592 MiB (github.com/ROCm/rocm-examples/issues/187,
/// github.com/ROCm/rocprofiler-sdk/issues/76).
pub const MI300X_192GB: (&str, u64) = ("MI300X-192GB", 196_592 << 20);
/// Apple's M2 with 16 GB of unified memory (PyTorch's MPS backend).
pub const M2_16GB_UNIFIED: (&str, u64) = ("M2-16GB-unified", 17_179_869_184);
/// Not a card: what a browser tab may give WebGPU.
pub const BROWSER_2GB: (&str, u64) = ("browser-2GB", 2 << 30);

/// The NVIDIA cards, which run PyTorch's CUDA caching allocator.
pub const CUDA_CARDS: [(&str, u64); 13] =
    [B200_180GB, H200_141GB, H100_80GB, A100_80GB, RTX_A6000_48GB, L40S_48GB, A100_40GB, RTX5090_32GB, RTX3090_24GB, RTX4090_24GB, A10_24GB, L4_24GB, T4_16GB];

/// The NVIDIA card with the least memory of which `bytes` fit in `total_memory` beside
/// `outside` (the CUDA context and what else is not PyTorch's); None if none holds it.
pub fn smallest_cuda_card(bytes: u64, outside: u64) -> Option<(&'static str, u64)> {
    CUDA_CARDS.into_iter().filter(|&(_, total)| total.saturating_sub(outside) >= bytes).min_by_key(|&(_, total)| total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_card_that_holds_it_beside_the_context() {
        let context = 450 << 20;
        assert_eq!(smallest_cuda_card(1, context), Some(T4_16GB));
        // 24 GiB does not fit an L4 (21.96 GiB as PyTorch reports it) but fits a 4090's 23.64.
        assert_eq!(smallest_cuda_card(22 << 30, context), Some(RTX4090_24GB));
        assert_eq!(smallest_cuda_card(RTX4090_24GB.1 - context, context), Some(RTX4090_24GB));
        // One byte more than a card holds: the next larger one, up the whole list.
        let ladder = [
            T4_16GB,
            L4_24GB,
            A10_24GB,
            RTX4090_24GB,
            RTX3090_24GB,
            RTX5090_32GB,
            A100_40GB,
            L40S_48GB,
            RTX_A6000_48GB,
            H100_80GB,
            A100_80GB,
            H200_141GB,
            B200_180GB,
        ];
        for pair in ladder.windows(2) {
            assert_eq!(smallest_cuda_card(pair[0].1 - context + 1, context), Some(pair[1]), "above {}", pair[0].0);
        }
        // Of the two 80 GB cards, the H100 reports a little less memory: it is the smaller.
        assert_eq!(smallest_cuda_card(50 << 30, context), Some(H100_80GB));
        assert_eq!(smallest_cuda_card(B200_180GB.1 - context + 1, context), None);
    }
}
