//! The simulation device: shapes only, the same allocator, a card of any size.

use tensormem::trace::Action;
use tensormem::{DType, Device, SimOptions};

#[test]
fn a_7b_parameter_model_fits_only_where_it_fits() {
    // 7e9 bf16 parameters: 14 GB. An 80 GB card holds them; a 16 GB T4 holds them barely, twice not.
    let h100 = Device::sim(SimOptions::preset("H100-80GB"));
    let params = h100.empty(&[7_000_000_000], DType::BF16).unwrap();
    // The segment is the request rounded to 2 MiB; the 586,752 bytes left are under 1 MiB, so
    // the block is not split and keeps them: allocated counts them too, as in PyTorch.
    assert_eq!(h100.memory_reserved(), 14_000_586_752);
    assert_eq!(h100.memory_allocated(), 14_000_586_752);
    let grads = h100.empty(&[7_000_000_000], DType::BF16).unwrap();
    drop((params, grads));
    let t4 = Device::sim(SimOptions::preset("T4-16GB"));
    let _params = t4.empty(&[7_000_000_000], DType::BF16).unwrap();
    let err = t4.empty(&[7_000_000_000], DType::BF16).unwrap_err().to_string();
    assert!(err.contains("Tried to allocate 13.04 GiB") && err.contains("total capacity of 14.74 GiB"), "{err}");
    assert_eq!(SimOptions::find("t4-16gb").unwrap().capacity, 15_828_320_256);
    assert!(SimOptions::find("no-such-card").is_none());
}

#[test]
fn allocations_carry_the_op_the_call_site_and_the_module_scope() {
    let dev = Device::sim(SimOptions::preset("A100-40GB"));
    let x = dev.ones(&[64, 64], DType::F32).unwrap();
    let y = {
        let _gpt = dev.scope("gpt");
        let _block = dev.scope("h.3");
        x.matmul(&x).unwrap()
    };
    let z = x.relu().unwrap();
    let trace = dev.snapshot().device_traces[0].clone();
    let allocs: Vec<_> = trace.iter().filter(|e| e.action == Action::Alloc).map(|e| e.frames.clone().unwrap()).collect();
    assert_eq!(allocs.len(), 4);
    assert_eq!(allocs[0][0].name, "full");
    assert_eq!(allocs[1][0].name, "matmul");
    assert_eq!(allocs[1][1].name, "gpt.h.3", "nested scopes join with dots");
    assert!(allocs[1][0].filename.ends_with("sim_device.rs"), "the Rust call site: {}", allocs[1][0].filename);
    // The first matmul's cuBLAS workspace, named as PyTorch's C++ stack names it.
    assert_eq!((allocs[2][0].name.as_str(), allocs[2][1].name.as_str()), ("at::cuda::getNewWorkspace", "gpt.h.3"));
    assert_eq!(allocs[3][0].name, "relu");
    assert_eq!(allocs[3].len(), 1, "the scope ended with its guards");
    drop((y, z));
}

#[test]
fn a_scope_ends_with_its_guard_whatever_order_guards_drop_in() {
    let dev = Device::sim(SimOptions::preset("A100-40GB"));
    let scope_of_next_alloc = |dev: &Device| {
        let _t = dev.empty(&[1], DType::F32).unwrap();
        let trace = dev.snapshot().device_traces[0].clone();
        let frames = trace.iter().rev().find(|e| e.action == Action::Alloc).unwrap().frames.clone().unwrap();
        frames.get(1).map(|f| f.name.clone()).unwrap_or_default()
    };
    let outer = dev.scope("gpt");
    let inner = dev.scope("h.0");
    assert_eq!(scope_of_next_alloc(&dev), "gpt.h.0");
    // The outer guard dropped first ends both scopes; the inner one then has nothing to end.
    drop(outer);
    assert_eq!(scope_of_next_alloc(&dev), "");
    let other = dev.scope("lm_head");
    let deeper = dev.scope("proj");
    drop(inner);
    assert_eq!(scope_of_next_alloc(&dev), "lm_head.proj", "a late inner guard does not end newer scopes");
    drop(other);
    assert_eq!(scope_of_next_alloc(&dev), "");
    drop(deeper);
}

#[test]
fn a_tensor_is_a_handle_with_an_identity_and_views_are_tensors_of_their_own() {
    let dev = Device::sim(SimOptions::preset("A100-40GB"));
    let x = dev.ones(&[256, 256], DType::F32).unwrap();
    let y = x.share();
    assert!(y.same(&x) && y.id() == x.id(), "y = x names the same tensor");
    let v = x.t().unwrap();
    assert!(!v.same(&x) && v.id() != x.id(), "a view is another tensor");
    assert_eq!(v.storage_id(), x.storage_id(), "over the same storage");
    let held = dev.memory_allocated();
    drop(x);
    drop(y);
    assert_eq!(dev.memory_allocated(), held, "the view keeps the storage alive");
    drop(v);
    assert_eq!(dev.memory_allocated(), 0, "the last handle frees it");
}
