//! The engine benchmark in headless Chromium's WebGPU (Dawn), where creating a buffer costs far
//! more than on lavapipe: `bash scripts/bench-web-gpu.sh` runs it and prints its JSON (it is
//! not part of the test suite: it measures, it asserts nothing about speed).
#![cfg(target_arch = "wasm32")]

use tensormem::bench::{self, BenchOptions};
use tensormem::{Device, GpuOptions};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test]
async fn engine_speed_in_the_browser() {
    let dev = Device::gpu(GpuOptions::default()).await.expect("the browser exposes a WebGPU adapter");
    let report = bench::run(&dev, &BenchOptions::default(), &mut |step| web_sys_log(&format!("  {step}..."))).await.unwrap();
    web_sys_log(&format!("BENCH_JSON {}", serde_json::to_string(&report).unwrap()));
}

fn web_sys_log(text: &str) {
    wasm_bindgen_test::console_log!("{text}");
}
