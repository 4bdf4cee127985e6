//! The workspaces cuBLAS and cuBLASLt get from PyTorch's caching allocator
//! (`aten/src/ATen/cuda/CublasHandlePool.cpp`).
//!
//! PyTorch keeps one cuBLAS handle per thread and device, and gives each (handle, stream) pair a
//! workspace the first time a matmul runs there: a block from the caching allocator, allocated
//! right after the matmul's output and never freed (`empty_cache` keeps it). The autograd
//! engine runs backward on a thread of its own, so a training step holds two: the main thread's
//! and autograd's. A matmul that goes through cuBLASLt (addmm with a bias, `F.linear`) also gets
//! the Lt workspace of that pair, after the cuBLAS one.
//!
//! A ROCm build (an AMD card) does the same through hipBLAS and hipBLASLt, with its own defaults
//! (`parseChosenWorkspaceSize` and `parseCUDABlasLtWorkspaceSize` under `USE_ROCM`, pytorch/pytorch
//! at 26a3905): 128 MiB for gfx94x and gfx95x (MI300, MI350), 32 MiB on older cards, and 76 MiB
//! for hipBLASLt, which never shares hipBLAS's.

/// What ATen reads from `cudaDeviceProp` that decides what it allocates: how long reductions are
/// split, and the size of cuBLAS's workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaCard {
    pub multiprocessors: super::Multiprocessors,
    /// Compute capability (`major`, `minor`): 9.0 for the H100; on ROCm the `gfx` version
    /// (9.4 for the MI300X's gfx942).
    pub capability: (u32, u32),
    /// An AMD card under PyTorch's ROCm build (HIP): hipBLAS's and hipBLASLt's workspaces.
    pub rocm: bool,
}

impl CudaCard {
    /// The workspaces PyTorch 2.11 gives each handle on this card, `CUBLAS_WORKSPACE_CONFIG`
    /// (a size per handle, in bytes; `HIPBLAS_WORKSPACE_CONFIG` on ROCm) overriding the default.
    pub fn workspaces(&self, cublas_override: Option<u64>) -> BlasWorkspaces {
        let (default, cublaslt) = if self.rocm {
            (default_hipblas_workspace(self.capability), HIPBLASLT_WORKSPACE)
        } else {
            (default_cublas_workspace(self.capability), CUBLASLT_WORKSPACE)
        };
        BlasWorkspaces { cublas: cublas_override.unwrap_or(default), cublaslt }
    }
}

/// Bytes of the two workspaces of one (handle, stream) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlasWorkspaces {
    pub cublas: u64,
    /// 0: cuBLASLt shares the cuBLAS workspace (`TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`).
    pub cublaslt: u64,
}

/// `parseChosenWorkspaceSize`'s default: `:4096:8` (32 MiB) on Hopper and Blackwell (majors 9,
/// 10 and 12), `:4096:2:16:8` elsewhere (8 MiB plus 128 KiB; PyTorch before 2.3 used this on
/// every card).
pub fn default_cublas_workspace(capability: (u32, u32)) -> u64 {
    if matches!(capability.0, 9 | 10 | 12) { 4096 * 1024 * 8 } else { 4096 * 1024 * 2 + 16 * 1024 * 8 }
}

/// `CUBLASLT_WORKSPACE_SIZE`'s default, 1,024 KiB.
pub const CUBLASLT_WORKSPACE: u64 = 1024 * 1024;

/// ROCm's `parseChosenWorkspaceSize` default: 128 MiB where `isGPUArch({"gfx94", "gfx95"})`
/// (MI300X, MI325X, MI350), 32 MiB elsewhere.
pub fn default_hipblas_workspace(gfx: (u32, u32)) -> u64 {
    if gfx.0 == 9 && matches!(gfx.1, 4 | 5) { 128 << 20 } else { 32 << 20 }
}

/// ROCm's `HIPBLASLT_WORKSPACE_SIZE` default, 76 MiB (`76*1024` KiB).
pub const HIPBLASLT_WORKSPACE: u64 = 76 << 20;

/// `CUBLAS_WORKSPACE_CONFIG` as PyTorch reads it: every `:SIZE:COUNT` pair (SIZE in KiB) adds
/// SIZE x COUNT KiB, so `:4096:8` is 32 MiB and `:4096:2:16:8` 8,519,680 bytes. Where PyTorch
/// warns and falls back to the default, this says what is wrong.
pub fn parse_workspace_config(text: &str) -> Result<u64, String> {
    let bad = || format!("CUBLAS_WORKSPACE_CONFIG {text:?}: expected :SIZE:COUNT pairs, SIZE in KiB (e.g. :4096:8 for 32 MiB, or :4096:2:16:8)");
    let mut total = 0u64;
    let mut matched = false;
    let mut rest = text.trim();
    // The non-overlapping matches of `:([0-9]+):([0-9]+)`, as std::sregex_iterator finds them.
    while let Some(at) = rest.find(':') {
        rest = &rest[at + 1..];
        let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
        let size_len = digits(rest);
        if size_len == 0 || !rest[size_len..].starts_with(':') {
            continue;
        }
        let count_text = &rest[size_len + 1..];
        let count_len = digits(count_text);
        if count_len == 0 {
            continue;
        }
        let size: u64 = rest[..size_len].parse().map_err(|_| bad())?;
        let count: u64 = count_text[..count_len].parse().map_err(|_| bad())?;
        total = size.checked_mul(1024).and_then(|b| b.checked_mul(count)).and_then(|b| b.checked_add(total)).ok_or_else(bad)?;
        matched = true;
        rest = &count_text[count_len..];
    }
    if matched { Ok(total) } else { Err(bad()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_config_sums_each_pair_in_kib() {
        assert_eq!(parse_workspace_config(":4096:8"), Ok(33_554_432));
        assert_eq!(parse_workspace_config(":4096:2:16:8"), Ok(8_519_680));
        assert_eq!(parse_workspace_config(" :16:8 "), Ok(131_072));
        assert_eq!(parse_workspace_config(":0:0"), Ok(0));
        for bad in ["", "4096", ":4096", "::8", ":x:8", ":99999999999999999999:1"] {
            assert!(parse_workspace_config(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_follows_the_compute_capability() {
        assert_eq!(default_cublas_workspace((9, 0)), 32 << 20);
        assert_eq!(default_cublas_workspace((10, 0)), 32 << 20);
        assert_eq!(default_cublas_workspace((8, 0)), 8_519_680);
        assert_eq!(default_cublas_workspace((8, 9)), 8_519_680);
        assert_eq!(default_cublas_workspace((7, 5)), 8_519_680);
    }

    #[test]
    fn rocm_cards_take_hipblas_defaults() {
        let mi300x =
            CudaCard { multiprocessors: super::super::Multiprocessors { count: 304, max_threads_each: 2048, warp_size: 64 }, capability: (9, 4), rocm: true };
        assert_eq!(mi300x.workspaces(None), BlasWorkspaces { cublas: 134_217_728, cublaslt: 79_691_776 });
        assert_eq!(mi300x.workspaces(Some(8_519_680)).cublas, 8_519_680);
        // An MI250X (gfx90a) keeps the older 32 MiB.
        assert_eq!(default_hipblas_workspace((9, 0)), 32 << 20);
        // The same figures under CUDA's rules: 32 MiB from major 9, and 1 MiB for cuBLASLt.
        let nvidia = CudaCard { rocm: false, ..mi300x };
        assert_eq!(nvidia.workspaces(None), BlasWorkspaces { cublas: 32 << 20, cublaslt: 1 << 20 });
    }
}
