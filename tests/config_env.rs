//! Settings from the environment, as PyTorch reads them. One test in its own binary: it changes
//! the process environment.

use tensormem::alloc::AllocatorConfig;

#[test]
fn pytorch_cuda_alloc_conf_then_pytorch_alloc_conf() {
    // SAFETY: this test binary runs this single test; no other thread reads the environment.
    unsafe {
        std::env::remove_var("PYTORCH_CUDA_ALLOC_CONF");
        std::env::set_var("PYTORCH_ALLOC_CONF", "expandable_segments:True");
    }
    assert!(AllocatorConfig::from_env().unwrap().expandable_segments);
    unsafe { std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256") };
    let c = AllocatorConfig::from_env().unwrap();
    assert_eq!(c.max_split_size, 256 << 20, "the CUDA-specific name wins");
    assert!(!c.expandable_segments);
    unsafe { std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", "bogus:1") };
    assert_eq!(AllocatorConfig::from_env().unwrap_err().message, "Unrecognized key 'bogus' in CUDA allocator config.");
}
