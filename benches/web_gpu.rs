//! The engine benchmark in headless Chromium's WebGPU (Dawn), where creating a buffer costs far
//! more than on lavapipe: `bash scripts/bench-web-gpu.sh` runs it and prints its JSON. It
//! measures, and asserts nothing about speed; `tensormem::bench` repeats each figure itself, so
//! the Criterion handle wasm-bindgen's runner passes is not used.
#![cfg_attr(target_arch = "wasm32", no_main)]

#[cfg(target_arch = "wasm32")]
mod browser {
    use tensormem::bench::{self, BenchOptions};
    use tensormem::{Device, GpuOptions};
    use wasm_bindgen_test::*;

    wasm_bindgen_test_configure!(run_in_browser);

    #[wasm_bindgen_bench]
    async fn engine_speed_in_the_browser(_: &mut Criterion) {
        let dev = Device::gpu(GpuOptions::default()).await.expect("the browser exposes a WebGPU adapter");
        let report = bench::run(&dev, &BenchOptions::default(), &mut |step| console_log!("  {step}...")).await.unwrap();
        console_log!("BENCH_JSON {}", serde_json::to_string(&report).unwrap());
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    eprintln!("web_gpu runs in headless Chromium: bash scripts/bench-web-gpu.sh (natively: tensormem bench)");
}
