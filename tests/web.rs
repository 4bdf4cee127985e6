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
    // x, the product, and cuBLAS's workspace (the budget models an H100: 32 MiB).
    assert_eq!(dev.memory_allocated(), 2 * 4 * 1024 * 1024 + (32 << 20));
}

#[wasm_bindgen_test]
async fn gpu_entries_carry_the_browsers_wall_time() {
    let dev = gpu().await;
    let _x = dev.ones(&[16], DType::F32).unwrap();
    let t = dev.snapshot().device_traces[0].at(0).time_us.unwrap();
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

/// A long trace's first view: its bands laid out a sample per pixel column, then fully when the
/// page asks, after which its pieces and warnings are the full layout's, across the boundary.
#[wasm_bindgen_test]
fn the_page_lays_the_bands_out_fully_after_the_first_image() {
    let (recorded, _) = variable_batch_recorded_and_stripped();
    let loaded = tensormem::web::LoadedTrace::parse(&tensormem::trace::to_pickle(&recorded)).unwrap();
    assert_eq!(loaded.events_of(0) as usize, recorded.device_traces[0].len());
    assert_eq!(loaded.events_of(7), 0);
    let full = loaded.timeline(0).unwrap();
    assert!(!full.bands_for_first_image());
    let mut view = loaded.timeline_for_first_image(0, 40).unwrap();
    assert!(view.bands_for_first_image());
    assert!(view.piece_x0().length() < full.piece_x0().length(), "a sample per column lays fewer pieces");
    assert_eq!(view.alloc_end().to_vec(), full.alloc_end().to_vec());
    assert!(view.lay_full_bands());
    assert!(!view.bands_for_first_image());
    assert_eq!(view.piece_offsets().to_vec(), full.piece_offsets().to_vec());
    assert_eq!(view.piece_x0().to_vec(), full.piece_x0().to_vec());
    assert_eq!(view.piece_y().to_vec(), full.piece_y().to_vec());
    let meta: serde_json::Value = serde_json::from_str(&full.meta_json()).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&view.summary_warnings_json()).unwrap(), meta["summary"]["warnings"]);
    assert!(!view.lay_full_bands(), "laid out fully once");
}

/// The `variable-batch` scenario's trace, with the categories tensormem records, and without
/// them as a PyTorch snapshot is.
fn variable_batch_recorded_and_stripped() -> (tensormem::trace::Snapshot, tensormem::trace::Snapshot) {
    use tensormem::scenarios::{self, RunRequest};
    let run = scenarios::run(&RunRequest { scenario: "variable-batch".into(), ..Default::default() }).unwrap();
    let mut stripped = run.snapshot.clone();
    for t in &mut stripped.device_traces {
        t.edit(|e| e.category = None);
    }
    (run.snapshot, stripped)
}

/// The page colours a PyTorch snapshot (no categories) by the doctor's inferred categories and a
/// trace of tensormem's by its own, and either by frame; the inferred codes that cross the
/// boundary are the doctor's, and the page opens on the device the doctor picks.
#[wasm_bindgen_test]
fn the_page_colours_by_inferred_categories_and_opens_the_doctors_device() {
    use tensormem::trace::{Action, to_pickle};
    use tensormem::web::LoadedTrace;
    use tensormem::{doctor, timeline};
    let (recorded, stripped) = variable_batch_recorded_and_stripped();
    let loaded = LoadedTrace::parse(&to_pickle(&stripped)).unwrap();
    let mut view = loaded.timeline(0).unwrap();
    assert_eq!(view.color_options(), ["inferred", "frame"]);
    assert_eq!(view.color_by(), "frame");
    let built = timeline::build(&stripped, 0).unwrap();
    let groups_of = |json: &str, groups: &[u32]| -> Vec<String> {
        let groups_json: serde_json::Value = serde_json::from_str(json).unwrap();
        groups.iter().map(|&g| groups_json[g as usize]["kind"].as_str().unwrap().to_string()).collect()
    };
    let frames = groups_of(&view.groups_json(), &view.alloc_group().to_vec());

    view.set_color_by("inferred").unwrap();
    let inferred = doctor::infer(&built);
    let kinds = groups_of(&view.groups_json(), &view.alloc_group().to_vec());
    assert_eq!(kinds, inferred.iter().map(|i| i.name().to_string()).collect::<Vec<_>>());
    let codes = view.inferred();
    let code = |k: u32| js_sys::Uint8Array::from(codes.get(k)).to_vec();
    let names: serde_json::Value = serde_json::from_str(&view.inferred_names_json()).unwrap();
    let name = |list: &str, k: u8| names[list][k as usize].as_str().unwrap().to_string();
    let (category, confidence, reason) = (code(0), code(1), code(2));
    for (id, i) in inferred.iter().enumerate() {
        assert_eq!(name("categories", category[id]), i.name());
        assert_eq!(name("confidences", confidence[id]), i.confidence.name());
        assert_eq!(name("reasons", reason[id]), i.reason);
    }
    // The meta names the trace's own grouping while the inferred one colours the bands.
    let meta: serde_json::Value = serde_json::from_str(&view.meta_json()).unwrap();
    assert_eq!(meta["base_groups"], serde_json::to_value(&built.groups).unwrap());
    // Back to frames: the trace's own grouping again; a grouping the trace lacks is refused.
    view.set_color_by("frame").unwrap();
    assert_eq!(groups_of(&view.groups_json(), &view.alloc_group().to_vec()), frames);
    assert!(view.set_color_by("recorded").is_err());

    // tensormem's own trace: its recorded categories first.
    let recorded = LoadedTrace::parse(&to_pickle(&recorded)).unwrap();
    let mut view = recorded.timeline(0).unwrap();
    assert_eq!(view.color_options(), ["recorded", "inferred", "frame"]);
    assert_eq!(view.color_by(), "recorded");
    view.set_color_by("frame").unwrap();
    assert_eq!(groups_of(&view.groups_json(), &view.alloc_group().to_vec()), frames);

    // A second device whose trace records an out-of-memory error: the page opens on it.
    assert_eq!(loaded.default_device(), Some(0));
    let mut two = stripped.clone();
    let mut oom = two.device_traces[0].at(0).owned();
    (oom.action, oom.addr, oom.frames) = (Action::Oom, 0, None);
    two.device_traces.push(vec![oom].into());
    let two = LoadedTrace::parse(&to_pickle(&two)).unwrap();
    assert_eq!(two.devices(), vec![0, 1]);
    assert_eq!(two.default_device(), Some(1));
}

/// The page's worker hands the doctor the timeline it shows (`laid_out`) while it is grouped as
/// the trace groups its allocations: the findings are those of the doctor laying it out alone; a
/// view coloured otherwise hands nothing, and one of another trace is laid aside.
#[wasm_bindgen_test]
fn the_doctor_reads_the_timeline_the_page_shows() {
    use tensormem::trace::to_pickle;
    use tensormem::web::LoadedTrace;
    let (recorded, stripped) = variable_batch_recorded_and_stripped();
    let loaded = LoadedTrace::parse(&to_pickle(&stripped)).unwrap();
    let alone = loaded.diagnose(0).unwrap();
    let mut view = loaded.timeline(0).unwrap();
    view.set_color_by("inferred").unwrap();
    let shown = view.groups_json();
    assert!(view.laid_out().is_none(), "coloured by inferred categories, not the trace's own grouping");
    view.set_color_by("frame").unwrap();
    assert_eq!(loaded.diagnose_laid_out(0, view.laid_out(), Vec::new()).unwrap(), alone);
    view.set_color_by("inferred").unwrap();
    assert_eq!(view.groups_json(), shown);
    // Another trace's view (the same run with its categories) is laid aside.
    let other = LoadedTrace::parse(&to_pickle(&recorded)).unwrap();
    let other_view = other.timeline(0).unwrap();
    assert!(other_view.laid_out().is_some());
    assert_eq!(loaded.diagnose_laid_out(0, other_view.laid_out(), Vec::new()).unwrap(), alone);
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
