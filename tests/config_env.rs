//! Settings from the environment, as PyTorch reads them. A binary of its own: its tests change
//! the process environment, one at a time.

use tensormem::alloc::AllocatorConfig;
use tensormem::tensor::{MatmulChoice, MatmulKernel};
use tensormem::{Device, GpuOptions};

/// Held by each test while it reads or changes the environment.
static ENVIRONMENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn pytorch_cuda_alloc_conf_then_pytorch_alloc_conf() {
    let _alone = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the other tests of this binary wait for the lock; none reads the environment.
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

#[test]
fn tensormem_matmul_pins_a_kernel_or_the_rule_and_refuses_what_it_cannot_read() {
    let _alone = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: as above. (The allocator's settings as another test may have left them.)
    unsafe {
        std::env::remove_var("TENSORMEM_MATMUL");
        std::env::remove_var("PYTORCH_CUDA_ALLOC_CONF");
        std::env::remove_var("PYTORCH_ALLOC_CONF");
    }
    assert_eq!(GpuOptions::default().matmul, MatmulChoice::Measure);
    unsafe { std::env::set_var("TENSORMEM_MATMUL", "heuristic") };
    assert_eq!(GpuOptions::default().matmul, MatmulChoice::Heuristic);
    unsafe { std::env::set_var("TENSORMEM_MATMUL", "staged128k8db") };
    assert_eq!(GpuOptions::default().matmul, MatmulChoice::Fixed(MatmulKernel::from_name("staged128k8db").unwrap()));
    unsafe { std::env::set_var("TENSORMEM_MATMUL", "fastest") };
    let e = MatmulChoice::from_env().unwrap_err();
    assert!(e.starts_with("TENSORMEM_MATMUL=\"fastest\": expected measure, heuristic or a kernel (naive, "), "{e}");
    // Refused before an adapter is looked for: the same answer with a GPU or without one.
    let e = pollster::block_on(Device::gpu(GpuOptions::default())).unwrap_err().to_string();
    assert!(e.contains("TENSORMEM_MATMUL=\"fastest\""), "{e}");
    unsafe { std::env::remove_var("TENSORMEM_MATMUL") };
}
