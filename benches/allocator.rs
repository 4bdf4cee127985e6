//! `cargo bench`: allocator throughput with virtual segments, and replay speed on the largest
//! real fixture. Targets (issue "Foundation"): >= 10 M malloc+free pairs/s, >= 2 M replay events/s.

use std::hint::black_box;
use std::time::{Duration, Instant};
use tensormem::alloc::{AllocatorConfig, VirtualAllocator};
use tensormem::replay::{ReplayOptions, replay_device};
use tensormem::{DType, Device, SimOptions};

/// Runs `f` (which does `per_call` units of work) until about a second has passed; units/s.
fn rate(per_call: u64, mut f: impl FnMut()) -> f64 {
    f(); // warm up
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        f();
        calls += 1;
    }
    (calls * per_call) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // The size mix of a transformer step: small scalars, mid activations, large weights/grads.
    let sizes: Vec<u64> = (0..1024u64)
        .map(|i| match i % 8 {
            0..=2 => 4 + i * 8,
            3 | 4 => 300_000 + i * 512,
            5 | 6 => 4 << 20,
            _ => 64 << 20,
        })
        .collect();

    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    let pairs = rate(sizes.len() as u64, || {
        for &s in &sizes {
            let x = a.malloc(s, 0, None).unwrap();
            a.free_allocation(black_box(&x), None).unwrap();
        }
    });
    // Baseline measured in the same run on the same sizes: the system allocator (glibc malloc/free).
    let system = rate(sizes.len() as u64, || {
        for &s in &sizes {
            let layout = std::alloc::Layout::from_size_align(s as usize, 512).unwrap();
            // SAFETY: a non-zero layout, freed right away with the same layout.
            unsafe {
                let p = std::alloc::alloc(layout);
                std::alloc::dealloc(black_box(p), layout);
            }
        }
    });
    println!(
        "malloc+free pairs (cached, one live):   {:>8.2} M/s  (target >= 10); {:.2}x the system allocator ({:.2} M/s)",
        pairs / 1e6,
        pairs / system,
        system / 1e6
    );
    // The same through the address-keyed API (PyTorch's outer `allocated_blocks` map).
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    let by_address = rate(sizes.len() as u64, || {
        for &s in &sizes {
            let x = a.malloc(s, 0, None).unwrap();
            a.free(black_box(x.ptr), None).unwrap();
        }
    });
    println!("  ... freeing by address:               {:>8.2} M/s", by_address / 1e6);

    // With 256 tensors alive, so best fit searches a populated pool and blocks split and merge.
    let mut a = VirtualAllocator::virtual_with(AllocatorConfig::default());
    let mut live: Vec<_> = sizes.iter().take(256).map(|&s| a.malloc(s, 0, None).unwrap()).collect();
    let mut i = 0usize;
    let churn = rate(sizes.len() as u64, || {
        for &s in &sizes {
            let slot = (i * 7919) % live.len();
            a.free_allocation(&live[slot], None).unwrap();
            live[slot] = a.malloc(s, 0, None).unwrap();
            i += 1;
        }
    });
    println!("malloc+free pairs (256 live, churn):    {:>8.2} M/s", churn / 1e6);

    // The same one-live loop through the sim device, as a program does it: a tensor created and
    // dropped, its stack (op and call site) looked up and the trace recorded.
    let dev = Device::sim(SimOptions::preset("H100-80GB"));
    let tensors = rate(sizes.len() as u64, || {
        for &s in &sizes {
            black_box(dev.empty(&[s as usize / 4 + 1], DType::F32).unwrap());
        }
    });
    println!("sim device tensor create+drop (traced): {:>8.2} M/s", tensors / 1e6);

    let dir = std::env::var("TENSORMEM_FIXTURES").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/pytorch-snapshots").into());
    let path = std::path::Path::new(&dir).join("gpt-medium-ctx128-training.pickle");
    match std::fs::read(&path) {
        Ok(data) => {
            let t = Instant::now();
            let snap = tensormem::trace::load(&data).unwrap();
            let load = t.elapsed();
            let events = snap.trace_of(0).len() as u64;
            let replay = rate(events, || {
                black_box(replay_device(&snap, 0, &ReplayOptions::default(), &mut |_, _| {}).unwrap());
            });
            println!(
                "replay {} ({events} events):  {:>8.2} M events/s  (target >= 2); load {:.1} ms for {:.1} MB",
                path.file_name().unwrap().to_string_lossy(),
                replay / 1e6,
                load.as_secs_f64() * 1e3,
                data.len() as f64 / 1e6
            );
        }
        Err(e) => println!("replay: skipped ({}: {e})", path.display()),
    }
}
