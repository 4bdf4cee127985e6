//! The op suite natively, on whatever adapter wgpu finds (lavapipe here). Under CI=true a
//! missing adapter fails the run.

mod common;
mod suite;

use tensormem::{Device, GpuOptions};

/// Matmul choices go to a file of the test run's own, not to the user's cache.
fn options() -> GpuOptions {
    GpuOptions { tuning_file: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("matmul-kernels.json")), ..Default::default() }
}

fn gpu() -> Option<Device> {
    match pollster::block_on(Device::gpu(options())) {
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
    let packed = pollster::block_on(Device::gpu(GpuOptions { disable_native_f16: true, ..options() })).unwrap();
    assert!(!packed.adapter().unwrap().native_f16);
    pollster::block_on(suite::f16_program(&packed));
}

/// A GPU's reduction shapes (rows shared among invocations) on this adapter too, which may be
/// a software one that would otherwise take a thread per row.
#[test]
fn reductions_in_the_shapes_a_gpu_takes() {
    let Some(_) = gpu() else { return };
    let dev = pollster::block_on(Device::gpu(GpuOptions { gpu_kernel_shapes: true, ..options() })).unwrap();
    assert!(!dev.adapter().unwrap().cpu_kernel_shapes);
    pollster::block_on(suite::contiguous_rows_reduce_with_neighbours_reading_neighbours(&dev));
    pollster::block_on(suite::reductions_over_dims(&dev));
    pollster::block_on(suite::long_reductions_split_as_pytorch_splits_them(&dev));
}

/// On a GPU the first commands after a wait are submitted at once and later ones in batches
/// that double (1, 2, 4 ... 256 commands): every batch's kernel metadata is written into the
/// one metadata buffer that the batches before it may still be reading. A chain of dependent
/// ops across many such batches, read back now and then (each read starts the doubling again),
/// computes exactly what the CPU computes (one rounding per op: no fusion either side).
#[test]
fn work_submitted_early_and_in_doubling_batches_computes_every_op() {
    let Some(_) = gpu() else { return };
    let dev = pollster::block_on(Device::gpu(GpuOptions { gpu_kernel_shapes: true, ..options() })).unwrap();
    let start: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut x = dev.from_slice(&start, &[1000]).unwrap();
    let mut expected = start;
    for i in 0..700 {
        x = x.mul_scalar(0.75).unwrap().add_scalar(i as f64).unwrap();
        for e in &mut expected {
            *e = *e * 0.75 + i as f32;
        }
        if i % 233 == 0 || i == 699 {
            assert_eq!(pollster::block_on(x.to_vec::<f32>()).unwrap(), expected, "after op pair {i}");
        }
    }
}

/// A wait for the GPU past `wait_limit` is an error that says what was waited for, not a
/// hang (on a lent H100 the op suite once stopped and said nothing). Eight 512^3 products keep
/// even an H100 busy for about 100 us, a hundred times the limit; the wait starts as they are
/// submitted.
#[test]
fn a_wait_past_the_limit_is_an_error_not_a_hang() {
    let Some(_) = gpu() else { return };
    let limit = std::time::Duration::from_micros(1);
    let dev = pollster::block_on(Device::gpu(GpuOptions { wait_limit: Some(limit), ..options() })).unwrap();
    let x = dev.ones(&[512, 512], tensormem::DType::F32).unwrap();
    let mut y = x.relu().unwrap();
    for _ in 0..8 {
        y = y.matmul(&x).unwrap().mul_scalar(1.0 / 512.0).unwrap();
    }
    let error = pollster::block_on(y.to_vec::<f32>()).unwrap_err().to_string();
    assert!(error.contains("had not finished a read back to the host after") && error.contains("TENSORMEM_GPU_WAIT_LIMIT"), "{error}");
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
    // 2 weights per layer, then per batch an input and per layer two outputs, each freed; and
    // the first matmul's cuBLAS workspace (the GPU device models an H100's by default).
    let allocs = on_gpu.snapshot.device_traces[0].iter().filter(|e| e.action == tensormem::trace::Action::Alloc).count();
    assert_eq!(allocs, 4 + 4 * (1 + 2 * 2) + 1);
    // Expandable segments need virtual memory mapping, which WebGPU lacks: a clear error.
    let fix = RunRequest { variant: Some("fix".into()), ..request("gpu") };
    let err = pollster::block_on(scenarios::run_anywhere(&fix)).unwrap_err().to_string();
    assert!(err.contains("expandable_segments") && err.contains("sim device"), "{err}");
}

/// hf-train on a small Qwen2 config (grouped-query attention, q/k/v biases, tied embeddings,
/// LoRA on five linears) runs its real kernels and allocates as the sim device records;
/// attn=sdpa is simulated only and says so on the GPU.
#[test]
fn hf_train_allocates_identically_on_the_gpu_and_the_sim_device() {
    use tensormem::scenarios::{self, RunRequest};
    let Some(_) = gpu() else { return };
    let config = r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": true}"#;
    let request = |device: &str, attn: &str| RunRequest {
        scenario: "hf-train".into(),
        set: [("config", config), ("batch", "2"), ("context", "8"), ("dtype", "float32"), ("lora", "4"), ("lora_targets", "q,k,v,o,gate"), ("attn", attn)]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        device: Some(device.into()),
        ..Default::default()
    };
    let on_gpu = pollster::block_on(scenarios::run_anywhere(&request("gpu", "eager"))).unwrap();
    let on_sim = scenarios::run(&request("sim:H100-80GB", "eager")).unwrap();
    assert_eq!(on_gpu.steps, on_sim.steps);
    assert_eq!(on_gpu.trainable_parameters, on_sim.trainable_parameters);
    let events = |r: &scenarios::RunResult| r.snapshot.device_traces[0].iter().map(|e| (e.action, e.size, e.category)).collect::<Vec<_>>();
    assert_eq!(events(&on_gpu), events(&on_sim));
    let mut sdpa = request("gpu", "sdpa");
    sdpa.set.insert("amp".into(), "bfloat16".into());
    let err = pollster::block_on(scenarios::run_anywhere(&sdpa)).unwrap_err().to_string();
    assert!(err.contains("simulated only"), "{err}");
}

/// hf-generate on a small Llama (grouped-query attention) runs its real kernels (the dynamic
/// cache's cats, the static cache's in-place writes, the argmax) and allocates as the sim
/// device records, with either cache.
#[test]
fn hf_generate_allocates_identically_on_the_gpu_and_the_sim_device() {
    use tensormem::scenarios::{self, RunRequest};
    let Some(_) = gpu() else { return };
    let config = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}"#;
    for cache in ["dynamic", "static"] {
        let request = |device: &str| RunRequest {
            scenario: "hf-generate".into(),
            set: [("config", config), ("batch", "2"), ("prompt", "8"), ("new_tokens", "4"), ("dtype", "float32"), ("cache", cache)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            device: Some(device.into()),
            ..Default::default()
        };
        let on_gpu = pollster::block_on(scenarios::run_anywhere(&request("gpu"))).unwrap();
        let on_sim = scenarios::run(&request("sim:H100-80GB")).unwrap();
        assert_eq!(on_gpu.steps, on_sim.steps, "{cache}");
        let events = |r: &scenarios::RunResult| r.snapshot.device_traces[0].iter().map(|e| (e.action, e.size, e.category)).collect::<Vec<_>>();
        assert_eq!(events(&on_gpu), events(&on_sim), "{cache}");
    }
}

/// matmul measures the candidate kernels at the first use of a class of shapes, off the
/// allocator (the trace is the program's alone), keeps the winner in its file per adapter and
/// reads it from there in later runs; tiny products are not measured; a damaged file is
/// measured over and rewritten.
#[test]
fn matmul_kernels_are_measured_at_first_use_and_remembered() {
    use tensormem::DType;
    use tensormem::tensor::{MatmulChoice, MatmulKernel};
    let Some(_) = gpu() else { return };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tuning-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let file = dir.join("kernels.json");
    let open = |matmul: MatmulChoice| pollster::block_on(Device::gpu(GpuOptions { matmul, tuning_file: Some(file.clone()), ..Default::default() })).unwrap();
    let read = || serde_json::from_slice::<serde_json::Value>(&std::fs::read(&file).unwrap()).unwrap();

    let dev = open(MatmulChoice::Measure);
    assert_eq!(dev.matmul_kernel(DType::F32, 8, 200, 200), MatmulKernel::heuristic(8, 200));
    assert!(!file.exists(), "an 8-row product is not measured");

    // The first product of its class: right, and the trace holds its tensors only.
    let program = |dev: &Device| {
        let a_data: Vec<f32> = (0..100 * 96).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
        let b_data: Vec<f32> = (0..96 * 132).map(|i| ((i * 53) % 97) as f32 / 97.0).collect();
        let c = dev.from_slice(&a_data, &[100, 96]).unwrap().matmul(&dev.from_slice(&b_data, &[96, 132]).unwrap()).unwrap();
        let got = pollster::block_on(c.to_vec::<f32>()).unwrap();
        for (i, j) in [(0, 0), (57, 101), (99, 131)] {
            let want: f32 = (0..96).map(|k| a_data[i * 96 + k] * b_data[k * 132 + j]).sum();
            assert!((got[i * 132 + j] - want).abs() < 1e-4, "c[{i},{j}] = {} != {want}", got[i * 132 + j]);
        }
        dev.snapshot().device_traces[0].iter().map(|e| (e.action, e.size)).collect::<Vec<_>>()
    };
    assert_eq!(program(&dev), program(&open(MatmulChoice::Heuristic)), "measuring allocates nothing the trace sees");
    let adapters = read()["adapters"].as_object().unwrap().clone();
    assert_eq!(adapters.len(), 1);
    let classes = adapters.values().next().unwrap().as_object().unwrap();
    assert_eq!(classes.len(), 1, "one class measured: {classes:?}");
    let tuning = classes.values().next().unwrap();
    let winner = MatmulKernel::from_name(tuning["kernel"].as_str().unwrap()).unwrap();
    assert!(MatmulKernel::CANDIDATES.contains(&winner));
    let speeds = tuning["gflops"].as_object().unwrap();
    assert_eq!(speeds.len(), dev.matmul_candidates(DType::F32, [true, true]).len());
    // Staged kernels are measured only where both operands load four elements at a time, and
    // only on a GPU.
    let staged = |vec4| dev.matmul_candidates(DType::F32, vec4).into_iter().filter(|k| matches!(k, MatmulKernel::Staged(_))).count();
    assert_eq!((staged([false, true]), staged([true, false])), (0, 0));
    assert_eq!(staged([true, true]) > 0, !dev.adapter().unwrap().runs_on_cpu);
    assert!(speeds.values().all(|g| g.as_f64().unwrap() > 0.0), "{speeds:?}");
    let best = speeds.iter().max_by(|a, b| a.1.as_f64().partial_cmp(&b.1.as_f64()).unwrap()).unwrap().0;
    assert_eq!(best, &winner.name());

    // Contiguous aligned f32 is another class; a later run takes its kernel from the file.
    let first = dev.matmul_kernel(DType::F32, 300, 300, 300);
    assert_eq!(dev.matmul_kernel(DType::F32, 500, 500, 500), first, "same class: 256 to 511");
    // A larger class is measured at its own size on a GPU; a CPU adapter (lavapipe here) measures
    // it at 256, so it shares the file's entry.
    if dev.adapter().unwrap().runs_on_cpu {
        assert_eq!(dev.matmul_kernel(DType::F32, 2000, 2000, 2000), first, "measured at 256 on a CPU adapter");
    }
    let mut file_json = read();
    let adapter = file_json["adapters"].as_object().unwrap().keys().next().unwrap().clone();
    assert_eq!(file_json["adapters"][&adapter].as_object().unwrap().len(), 2);
    let planted = if first == MatmulKernel::Blocked { MatmulKernel::Register { rows: 4, cols: 4 } } else { MatmulKernel::Blocked };
    file_json["adapters"][&adapter]["float32 256x256x256 a4 b4"]["kernel"] = planted.name().into();
    std::fs::write(&file, serde_json::to_vec(&file_json).unwrap()).unwrap();
    assert_eq!(open(MatmulChoice::Measure).matmul_kernel(DType::F32, 300, 300, 300), planted, "read from the file, not measured");
    assert_eq!(open(MatmulChoice::Fixed(MatmulKernel::Tiled)).matmul_kernel(DType::F32, 300, 300, 300), MatmulKernel::Tiled);

    std::fs::write(&file, b"{ not json").unwrap();
    let kernel = open(MatmulChoice::Measure).matmul_kernel(DType::F32, 300, 300, 300);
    assert!(MatmulKernel::CANDIDATES.contains(&kernel));
    assert_eq!(read()["format"], "tensormem matmul tuning 2", "the damaged file was rewritten");
    std::fs::remove_dir_all(&dir).unwrap();
}
