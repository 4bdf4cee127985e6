//! Peak heap while loading a snapshot and laying out its timeline (what the page's worker holds),
//! natively, with a counting allocator: `cargo run --release --example load_memory -- FILE`.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
        PEAK.fetch_max(live, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn mb(b: usize) -> String {
    format!("{:.1} MB", b as f64 / 1048576.0)
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: load_memory FILE");
        std::process::exit(2);
    };
    let data = std::fs::read(&path).expect("read");
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let t0 = std::time::Instant::now();
    let snap = tensormem::trace::load(&data).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let loaded = t0.elapsed();
    let (load_peak, model) = (PEAK.load(Relaxed) - base, LIVE.load(Relaxed) - base);
    PEAK.store(LIVE.load(Relaxed), Relaxed);
    let t = tensormem::timeline::build(&snap, snap.devices().first().copied().unwrap_or(0)).expect("timeline");
    let built = t0.elapsed() - loaded;
    let layout_peak = PEAK.load(Relaxed) - base;
    let timeline = LIVE.load(Relaxed) - base - model;
    println!(
        "file {}; load {loaded:?}: peak {} above the file, model {}; layout {built:?}: peak {} (model + layout), timeline {}; {} entries, {} pieces",
        mb(data.len()),
        mb(load_peak),
        mb(model),
        mb(layout_peak),
        mb(timeline),
        snap.device_traces.iter().map(|t| t.len()).sum::<usize>(),
        t.pieces.x0.len()
    );
}
