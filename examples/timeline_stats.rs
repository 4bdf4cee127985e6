fn main() {
    let path = std::env::args().nth(1).unwrap();
    let t0 = std::time::Instant::now();
    let snap = tensormem::trace::load_file(std::path::Path::new(&path)).unwrap();
    let t1 = t0.elapsed();
    let t = tensormem::timeline::build(&snap, 0).unwrap();
    let t2 = t0.elapsed();
    println!("load {:?} build {:?} events {} allocs {} pieces {} frames {} stacks {}", t1, t2 - t1, t.events, t.allocations.size.len(), t.pieces.x0.len(), t.frames.len(), t.stack_offsets.len());
}
