//! Browser tests (headless Chromium's WebGPU): `bash scripts/test-web.sh`. The whole op suite, on
//! an adapter with other limits (offset alignment 256, no shader-f16).
#![cfg(target_arch = "wasm32")]

use tensormem::{DType, Device, GpuOptions, SimOptions};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn gpu() -> Device {
    Device::gpu(GpuOptions::default()).await.expect("the browser exposes a WebGPU adapter")
}

#[wasm_bindgen_test]
async fn adapter_limits_are_the_browsers() {
    let dev = gpu().await;
    let a = dev.adapter().unwrap();
    assert!(a.min_storage_buffer_offset_alignment <= 256, "{}", a.min_storage_buffer_offset_alignment);
    assert!(512 % a.min_storage_buffer_offset_alignment == 0);
}

#[wasm_bindgen_test]
fn the_sim_device_runs_in_the_browser() {
    let dev = Device::sim(SimOptions::preset("browser-2GB"));
    let x = dev.ones(&[1024, 1024], DType::F32).unwrap();
    let _y = x.matmul(&x).unwrap();
    assert_eq!(dev.memory_allocated(), 2 * 4 * 1024 * 1024);
}

#[wasm_bindgen_test]
async fn gpu_entries_carry_the_browsers_wall_time() {
    let dev = gpu().await;
    let _x = dev.ones(&[16], DType::F32).unwrap();
    let t = dev.snapshot().device_traces[0][0].time_us.unwrap();
    // Between 2024 and 2100: the browser's clock, in microseconds rather than milliseconds.
    assert!((1_704_067_200_000_000..4_102_444_800_000_000).contains(&t), "{t}");
}

/// The curves the page gets chunk by chunk from the worker are the timeline's own, across more
/// than one chunk (65,536 positions).
#[wasm_bindgen_test]
fn the_page_gets_the_timelines_curves() {
    use tensormem::alloc::{AllocatorConfig, RecordContext, TimeSource, VirtualAllocator};
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::Alloc, 1 << 20);
    a.history_mut().set_time_source(TimeSource::modelled());
    let mut live = Vec::new();
    for i in 0..40_000u64 {
        a.history_mut().advance_time_us(3.0);
        live.push(a.malloc(512 * (1 + i % 7), 0, None).unwrap());
        if i % 3 != 0 {
            let b = live.swap_remove((i as usize * 7919) % live.len());
            a.free(b.ptr, None).unwrap();
        }
    }
    let snapshot = a.snapshot();
    let expected = tensormem::timeline::build(&snapshot, 0).unwrap();
    assert!(expected.allocated.len() > 1 << 16);
    let loaded = tensormem::web::LoadedTrace::parse(&tensormem::trace::to_pickle(&snapshot)).unwrap();
    let view = loaded.timeline(0).unwrap();
    let curves = loaded.curves(&view).unwrap();
    let got = |k: u32| js_sys::Float64Array::from(curves.get(k)).to_vec();
    assert_eq!(got(0), expected.allocated);
    assert_eq!(got(1), expected.reserved);
    assert_eq!(got(2), expected.time_us);
}

/// Across the wasm boundary, "nothing under the pointer" is `None` (JavaScript's undefined), not
/// a sentinel id; the keyboard's stack at a position comes as `[id, bottom]` pairs, bottom up.
#[wasm_bindgen_test]
fn the_page_hit_tests_and_steps_through_bands_across_the_boundary() {
    use std::sync::Arc;
    use tensormem::alloc::{AllocatorConfig, RecordContext, VirtualAllocator};
    use tensormem::trace::Frame;
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    a.record_memory_history(true, RecordContext::All, 1000);
    let f = |name: &str| Arc::from(vec![Frame { filename: "train.py".into(), line: 1, name: name.into() }]);
    let x = a.malloc(1000, 0, Some(f("x"))).unwrap();
    let _y = a.malloc(3000, 0, Some(f("y"))).unwrap();
    let _z = a.malloc(500, 0, Some(f("z"))).unwrap();
    a.free(x.ptr, None).unwrap();
    let snapshot = a.snapshot();
    let t = tensormem::timeline::build(&snapshot, 0).unwrap();
    let loaded = tensormem::web::LoadedTrace::parse(&tensormem::trace::to_pickle(&snapshot)).unwrap();
    let view = loaded.timeline(0).unwrap();
    let (before_free, end) = (t.allocations.start[2], t.events as u32);
    assert_eq!(view.hit_test(before_free, 1500.0, 0.0), Some(1));
    assert_eq!(view.hit_test(before_free, 1e9, 0.0), None);
    assert_eq!(view.hit_test(0, 10.0, 0.0), None);
    assert_eq!(view.stack_at(before_free), vec![0.0, 0.0, 1.0, 1000.0, 2.0, 4000.0]);
    assert_eq!(view.stack_at(end), vec![1.0, 0.0, 2.0, 3000.0]);
}

mod suite;

macro_rules! in_browser {
    ($($name:ident),* $(,)?) => {
        $(
            #[wasm_bindgen_test]
            async fn $name() {
                suite::$name(&gpu().await).await;
            }
        )*
    };
}

suite::every_check!(in_browser);
