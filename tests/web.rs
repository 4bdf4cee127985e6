//! Browser tests (headless Chromium's WebGPU): `bash scripts/test-web.sh`. The same kernels as the
//! native tests, on an adapter with other limits (offset alignment 256, no shader-f16).
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
async fn kernels_run_in_the_browser() {
    let dev = gpu().await;
    let a = dev.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let b = dev.from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
    let c = a.add(&b).unwrap().relu().unwrap();
    assert_eq!(c.to_vec::<f32>().await.unwrap(), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    let t = a.t().unwrap().contiguous().unwrap();
    assert_eq!(t.to_vec::<f32>().await.unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let m = a.matmul(&a.t().unwrap()).unwrap();
    assert_eq!(m.to_vec::<f32>().await.unwrap(), vec![14.0, 32.0, 32.0, 77.0]);
    assert_eq!(a.sum(&[], false).unwrap().item::<f32>().await.unwrap(), 21.0);
}

#[wasm_bindgen_test]
async fn memory_facts_hold_in_the_browser() {
    let dev = gpu().await;
    let x = dev.zeros(&[1000, 1000], DType::F32).unwrap();
    assert_eq!(dev.memory_allocated(), 4_000_256);
    assert_eq!(dev.memory_reserved(), 20 << 20);
    let _v = x.t().unwrap();
    assert_eq!(dev.memory_allocated(), 4_000_256);
}

#[wasm_bindgen_test]
fn the_sim_device_runs_in_the_browser() {
    let dev = Device::sim(SimOptions::preset("browser-2GB"));
    let x = dev.ones(&[1024, 1024], DType::F32).unwrap();
    let _y = x.matmul(&x).unwrap();
    assert_eq!(dev.memory_allocated(), 2 * 4 * 1024 * 1024);
}

#[wasm_bindgen_test]
async fn float16_runs_packed_without_shader_f16() {
    use half::f16;
    let dev = gpu().await;
    let data: Vec<f16> = (0..15).map(|i| f16::from_f32(i as f32 - 7.0)).collect();
    let x = dev.from_slice(&data, &[3, 5]).unwrap();
    let y = x.t().unwrap().relu().unwrap().mul_scalar(0.5).unwrap();
    let got = y.to_vec::<f16>().await.unwrap();
    for r in 0..5 {
        for c in 0..3 {
            assert_eq!(got[r * 3 + c].to_f32(), data[c * 5 + r].to_f32().max(0.0) * 0.5);
        }
    }
    let s = x.sum(&[], false).unwrap().item::<f16>().await.unwrap();
    assert_eq!(s.to_f32(), (0..15).map(|i| i as f32 - 7.0).sum::<f32>());
}
