//! Trace timestamps: the sim device and the scenarios run on a clock modelled on the card's
//! speed; snapshots say which clock stamped them. (The GPU's wall clock: tests/gpu_ops.rs.)

use tensormem::alloc::{MODELLED_EPOCH_US, TimeSource};
use tensormem::scenarios::{self, RunRequest};
use tensormem::trace::{self, Action, Category, Recording};
use tensormem::{DType, Device, SimOptions};

fn elapsed_us(dev: &Device) -> f64 {
    match dev.time_source() {
        TimeSource::Modelled { elapsed_us } => elapsed_us,
        other => panic!("the sim device runs on modelled time, not {other:?}"),
    }
}

#[test]
fn a_sim_matmul_advances_the_clock_by_its_roofline_cost() {
    let dev = Device::sim(SimOptions::preset("H100-80GB"));
    // `empty` runs no op, so the clock stays at its start.
    let x = dev.empty(&[1024, 1024], DType::F32).unwrap();
    assert_eq!(elapsed_us(&dev), 0.0);
    let y = x.matmul(&x).unwrap();
    // max(3 x 4 MiB / 3.35 TB/s = 3.756 us, 2 x 1024^3 FLOP / 67 TFLOP/s = 32.052 us): compute bound.
    let f32_matmul = elapsed_us(&dev);
    assert!((f32_matmul - 32.051_994_746_268_66).abs() < 1e-9, "{f32_matmul}");
    drop(y);
    let trace = dev.snapshot().device_traces[0].clone();
    let time_of = |a: Action| trace.iter().find(|e| e.action == a).and_then(|e| e.time_us).unwrap();
    // The output is allocated before the kernel runs and freed after it.
    assert_eq!(time_of(Action::Alloc), MODELLED_EPOCH_US);
    assert_eq!(time_of(Action::FreeRequested), MODELLED_EPOCH_US + 32);

    // bf16 runs at the tensor-core rate: 2 x 1024^3 FLOP / 989.4 TFLOP/s = 2.170 us, still
    // above its bytes (3 x 2 MiB / 3.35 TB/s = 1.878 us).
    let h = dev.empty(&[1024, 1024], DType::BF16).unwrap();
    let _ = h.matmul(&h).unwrap();
    assert!((elapsed_us(&dev) - f32_matmul - 2.170_490_851_020_82).abs() < 1e-9);
    // A custom size is as fast as an H100.
    assert_eq!(SimOptions::custom(24 << 30).speed, SimOptions::preset("H100-80GB").speed);
}

#[test]
fn the_variable_batch_scenario_runs_on_modelled_time_and_categories_that_survive_pickle_and_json() {
    let run = scenarios::run(&RunRequest { scenario: "variable-batch".into(), ..Default::default() }).unwrap();
    let trace = &run.snapshot.device_traces[0];
    let times: Vec<i64> = trace.iter().map(|e| e.time_us.expect("every entry is timed")).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(times[0], MODELLED_EPOCH_US, "the first weight is allocated at the start");
    // Each batch's input is allocated after the previous batch ran.
    let inputs: Vec<i64> = trace.iter().filter(|e| e.category == Some(Category::Input)).map(|e| e.time_us.unwrap()).collect();
    assert_eq!(inputs.len(), 12);
    assert!(inputs.windows(2).all(|w| w[0] < w[1]), "{inputs:?}");
    // The roofline on an H100 (3.35 TB/s, 67 TFLOP/s f32): 16 random 16 MiB weights, then per
    // batch of 128 b tokens a random input and per layer two compute-bound matmuls (2 x 128 b
    // x 1024 x 4096 FLOP each) and a bandwidth-bound GELU in place (reads and writes the
    // 4 x wider activation): 105,116.08 us over the default batches.
    assert_eq!(times[times.len() - 1], MODELLED_EPOCH_US + 105_116);
    // The parameters are classified as such: 16 of them, 16 MiB each.
    let parameters: Vec<u64> = trace.iter().filter(|e| e.category == Some(Category::Parameter)).map(|e| e.size).collect();
    assert_eq!(parameters, vec![16 << 20; 16]);

    let recording = Some(Recording { time: "modelled".into(), device: "sim (H100-80GB)".into() });
    assert_eq!(run.snapshot.tensormem, recording);
    for bytes in [trace::to_pickle(&run.snapshot), trace::to_json(&run.snapshot).into_bytes()] {
        let back = trace::load(&bytes).unwrap();
        assert_eq!(back.tensormem, recording);
        let back_times: Vec<i64> = back.device_traces[0].iter().filter_map(|e| e.time_us).collect();
        assert_eq!(back_times, times);
        let categories = |t: &trace::Trace| t.iter().map(|e| e.category).collect::<Vec<_>>();
        assert_eq!(categories(&back.device_traces[0]), categories(trace), "categories survive the file");
    }
}

#[test]
fn the_reader_ignores_top_level_keys_it_does_not_know() {
    let snapshot = trace::load(br#"{"segments": [], "device_traces": [[]], "from_the_future": {"x": 1}}"#).unwrap();
    assert_eq!(snapshot.tensormem, None);
}

/// A replay (what-if, `replay --snapshot`) says what each allocation is for, as the recording did.
#[test]
fn a_replayed_trace_keeps_the_categories() {
    use tensormem::replay::{ReplayOptions, replay_device};
    let run = scenarios::run(&RunRequest { scenario: "variable-batch".into(), ..Default::default() }).unwrap();
    let options = ReplayOptions {
        keep_snapshot: true,
        config: Some(tensormem::alloc::AllocatorConfig::parse("expandable_segments:True").unwrap()),
        ..Default::default()
    };
    let replayed = replay_device(&run.snapshot, 0, &options, &mut |_, _| {}).unwrap().snapshot.unwrap();
    let categories = |s: &trace::Snapshot| s.device_traces[0].iter().filter(|e| e.action == Action::Alloc).map(|e| e.category).collect::<Vec<_>>();
    assert_eq!(categories(&replayed), categories(&run.snapshot));
    assert_eq!(categories(&replayed).iter().filter(|c| **c == Some(Category::Parameter)).count(), 16);
}
