fn main() {
    let path = std::env::args().nth(1).unwrap();
    let data = std::fs::read(&path).unwrap();
    for _ in 0..30 {
        let s = tensormem::trace::load(&data).unwrap();
        let t = tensormem::timeline::build(&s, 0).unwrap();
        std::hint::black_box(t);
    }
}
