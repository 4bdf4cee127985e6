//! The op suite natively, on whatever adapter wgpu finds (lavapipe here). Under CI=true a
//! missing adapter fails the run.

mod common;
mod suite;

use tensormem::{Device, GpuOptions};

fn gpu() -> Option<Device> {
    match pollster::block_on(Device::gpu(GpuOptions::default())) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            common::skip(format!("no GPU adapter ({e})"));
            None
        }
        Err(e) => panic!("no GPU adapter under CI: {e}"),
    }
}

macro_rules! native {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let Some(dev) = gpu() else { return };
                pollster::block_on(suite::$name(&dev));
            }
        )*
    };
}

suite::every_check!(native);

/// Both f16 paths on one machine: native shader-f16 and the packed words browsers without it use.
#[test]
fn float16_packed_even_where_shader_f16_exists() {
    let Some(_) = gpu() else { return };
    let packed = pollster::block_on(Device::gpu(GpuOptions { disable_native_f16: true, ..Default::default() })).unwrap();
    assert!(!packed.adapter().unwrap().native_f16);
    pollster::block_on(suite::f16_program(&packed));
}

/// A GPU device stamps its trace with the wall clock, in microseconds since the epoch as PyTorch does.
#[test]
fn gpu_trace_entries_carry_wall_time() {
    let Some(dev) = gpu() else { return };
    let now_us = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as i64;
    let start = now_us();
    let x = dev.ones(&[64, 64], tensormem::DType::F32).unwrap();
    let y = x.matmul(&x).unwrap().relu().unwrap();
    drop((x, y));
    let snapshot = dev.snapshot();
    let end = now_us();
    let times: Vec<i64> = snapshot.device_traces[0].iter().map(|e| e.time_us.expect("every entry is timed")).collect();
    assert!(times.len() >= 7, "{times:?}");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "non-decreasing: {times:?}");
    assert!(start <= times[0] && times[times.len() - 1] <= end, "{start} <= {times:?} <= {end}");
    assert_eq!(dev.time_source(), tensormem::alloc::TimeSource::Wall);
    let recording = snapshot.tensormem.unwrap();
    assert_eq!((recording.time.as_str(), recording.device.as_str()), ("wall", dev.name()));
}

/// A scenario is one program for both devices: on the GPU (real kernels, lavapipe here) it
/// allocates and frees exactly what the sim device records, and reports the same figures.
#[test]
fn a_scenario_allocates_identically_on_the_gpu_and_the_sim_device() {
    use tensormem::scenarios::{self, RunRequest};
    let Some(_) = gpu() else { return };
    let set = [("layers", "2"), ("hidden", "64"), ("seq", "8"), ("batches", "4,5,3,6")];
    let request = |device: &str| RunRequest {
        scenario: "variable-batch".into(),
        set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        device: Some(device.into()),
        ..Default::default()
    };
    let on_gpu = pollster::block_on(scenarios::run_anywhere(&request("gpu"))).unwrap();
    let on_sim = scenarios::run(&request("sim:H100-80GB")).unwrap();
    assert!(on_gpu.device.starts_with("gpu ("), "{}", on_gpu.device);
    assert_eq!(on_gpu.steps, on_sim.steps);
    assert_eq!((on_gpu.peak_allocated_bytes, on_gpu.peak_reserved_bytes), (on_sim.peak_allocated_bytes, on_sim.peak_reserved_bytes));
    let events = |r: &scenarios::RunResult| r.snapshot.device_traces[0].iter().map(|e| (e.action, e.size, e.category, e.frames.clone())).collect::<Vec<_>>();
    assert_eq!(events(&on_gpu), events(&on_sim));
    // 2 weights per layer, then per batch an input and per layer two outputs, each freed.
    let allocs = on_gpu.snapshot.device_traces[0].iter().filter(|e| e.action == tensormem::trace::Action::Alloc).count();
    assert_eq!(allocs, 4 + 4 * (1 + 2 * 2));
    // Expandable segments need virtual memory mapping, which WebGPU lacks: a clear error.
    let fix = RunRequest { variant: Some("fix".into()), ..request("gpu") };
    let err = pollster::block_on(scenarios::run_anywhere(&fix)).unwrap_err().to_string();
    assert!(err.contains("expandable_segments") && err.contains("sim device"), "{err}");
}
