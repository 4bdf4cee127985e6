//! Times loading a snapshot, laying out device 0's timeline, rasterising it at 1400x440 and
//! inferring its allocations' categories (the work the page's worker does), natively: `cargo run --release --example timeline_stats -- FILE`.

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: timeline_stats FILE");
        std::process::exit(2);
    };
    let t0 = std::time::Instant::now();
    let snap = match tensormem::trace::load_file(std::path::Path::new(&path)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let loaded = t0.elapsed();
    let t = match tensormem::timeline::build(&snap, snap.devices().first().copied().unwrap_or(0)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let built = t0.elapsed();
    let xs: Vec<f64> = (0..t.events + 2).map(|x| x as f64).collect();
    let order: Vec<u32> = (0..t.groups.len() as u32).collect();
    let colors: Vec<u32> = (1..=t.groups.len() as u32).collect();
    let r = tensormem::timeline::raster::Raster {
        xs: &xs,
        x0: 0.0,
        x1: (t.events + 1) as f64,
        width: 1400,
        height: 440,
        ymax: t.summary.peak_allocated_bytes.max(1) as f64 * 1.06,
        group_order: &order,
        group_color: &colors,
        hidden: &[],
        ghost: 0,
    };
    let pixels = tensormem::timeline::raster::rasterize(&t, &r);
    let rastered = t0.elapsed();
    // The categories the page colours a PyTorch trace's bands by (and shows in its details).
    let inferred = tensormem::doctor::infer(&t).len();
    let inferring = t0.elapsed() - rastered;
    println!(
        "load {:?}, layout {:?}, raster {:?} ({} painted pixels), categories inferred {inferring:?} ({inferred}); {} events, {} allocations, {} pieces",
        loaded,
        built - loaded,
        rastered - built,
        pixels.iter().filter(|&&p| p != 0).count(),
        t.events,
        t.allocations.size.len(),
        t.pieces.x0.len()
    );
}
