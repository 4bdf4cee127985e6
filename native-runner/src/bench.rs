//! `tensormem bench`: the library's benchmark (`tensormem::bench`) on the first adapter, printed
//! as a table or as JSON.

use tensormem::bench::{BenchOptions, BenchReport};

pub fn print(report: &BenchReport) {
    println!("adapter: {}", report.adapter);
    for m in &report.matmul {
        let others: Vec<String> = m.variants.iter().filter(|(name, _)| **name != m.kernel).map(|(name, g)| format!("{name} {g:.2}")).collect();
        println!(
            "matmul {}x{}x{} f32: {} {:.2} GFLOP/s, {:.1}x the naive kernel ({:.2}); others: {}; choosing took {:.0} ms",
            m.m,
            m.n,
            m.k,
            m.kernel,
            m.gflops,
            m.gflops / m.naive_gflops,
            m.naive_gflops,
            others.join(", "),
            m.tuning_ms
        );
    }
    println!("copy_buffer_to_buffer: {:.2} GB/s (read + written)", report.copy_gbps);
    println!(
        "elementwise add of {} f32: {:.2} GB/s, {:.0}% of copy",
        report.elementwise_elements,
        report.elementwise_gbps,
        100.0 * report.elementwise_gbps / report.copy_gbps
    );
    println!(
        "elementwise copy_ (a compute shader's own copy): {:.2} GB/s, {:.0}% of copy_buffer_to_buffer",
        report.elementwise_copy_gbps,
        100.0 * report.elementwise_copy_gbps / report.copy_gbps
    );
    println!(
        "sum of the same f32: {:.2} GB/s over rows of 1024, {:.2} GB/s over the whole tensor (bytes read)",
        report.reduction_gbps[0], report.reduction_gbps[1]
    );
    println!(
        "small ops with outputs from the cache: {:.0}/s; with a fresh buffer each: {:.0}/s ({:.2}x)",
        report.cached_op_loop_per_s,
        report.fresh_buffer_op_loop_per_s,
        report.cached_op_loop_per_s / report.fresh_buffer_op_loop_per_s
    );
    println!(
        "one tiny op (in-place add of 4 elements): {:.1} us, of which recording and submitting it on the host {:.1} us",
        report.dispatch_us, report.record_us
    );
    println!("caching allocator: {:.0} alloc+free of 1 MiB per second", report.alloc_free_per_s);
}

pub fn options(sizes: &[usize], elements: usize) -> BenchOptions {
    BenchOptions { sizes: sizes.to_vec(), elementwise_elements: elements, ..Default::default() }
}
