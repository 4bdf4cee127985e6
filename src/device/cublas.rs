//! The workspaces cuBLAS and cuBLASLt get from PyTorch's caching allocator
//! (`aten/src/ATen/cuda/CublasHandlePool.cpp`).
//!
//! PyTorch keeps one cuBLAS handle per thread and device, and gives each (handle, stream) pair a
//! workspace the first time a matmul runs there: a block from the caching allocator, allocated
//! right after the matmul's output and never freed (`empty_cache` keeps it). The autograd
//! engine runs backward on a thread of its own, so a training step holds two: the main thread's
//! and autograd's. A matmul that goes through cuBLASLt (addmm with a bias, `F.linear`) also gets
//! the Lt workspace of that pair, after the cuBLAS one.

/// What ATen reads from `cudaDeviceProp` that decides what it allocates: how long reductions are
/// split, and the size of cuBLAS's workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaCard {
    pub multiprocessors: super::Multiprocessors,
    /// Compute capability (`major`, `minor`): 9.0 for the H100.
    pub capability: (u32, u32),
}

impl CudaCard {
    /// The workspaces PyTorch 2.11 gives each handle on this card, `CUBLAS_WORKSPACE_CONFIG`
    /// (a size per handle, in bytes) overriding the default.
    pub fn workspaces(&self, cublas_override: Option<u64>) -> BlasWorkspaces {
        BlasWorkspaces { cublas: cublas_override.unwrap_or_else(|| default_cublas_workspace(self.capability)), cublaslt: CUBLASLT_WORKSPACE }
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
}
