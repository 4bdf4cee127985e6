//! The tables `tensormem replay` and `tensormem run` print.

use tensormem::alloc::format_size;
use tensormem::replay::{DeviceReplay, StartMode};
use tensormem::scenarios::RunResult;

/// One device's replay: recorded against replayed figures, then how closely they agree.
pub fn print_replay(r: &DeviceReplay) {
    let capacity = r.capacity.map_or("unlimited".to_string(), format_size);
    println!("device {}: {} events, settings {}, capacity {}", r.device, r.events, r.settings, capacity);
    let start = match r.start {
        StartMode::Recorded => "recorded (rebuilt from the final state)",
        StartMode::Replaced => "replaced (live allocations placed afresh, no cached blocks)",
        StartMode::Empty => "empty (the trace is the whole program)",
    };
    println!("  start {start}: {} reserved, {} allocated", format_size(r.start_reserved_bytes), format_size(r.start_allocated_bytes));
    if let Some(oom) = &r.out_of_memory_at_start {
        println!("  OUT OF MEMORY AT THE START: {oom}");
    }
    println!("  {:<28} {:>16} {:>16}", "", "recorded", "replayed");
    let rows: [(&str, String, String); 6] = [
        ("segment allocs (cudaMalloc)", r.recorded.segment_allocs.to_string(), r.replayed.figures.segment_allocs.to_string()),
        ("segment frees", r.recorded.segment_frees.to_string(), r.replayed.figures.segment_frees.to_string()),
        (
            "pages mapped / unmapped",
            format!("{} / {}", r.recorded.segment_maps, r.recorded.segment_unmaps),
            format!("{} / {}", r.replayed.figures.segment_maps, r.replayed.figures.segment_unmaps),
        ),
        ("peak reserved", format_size(r.recorded.peak_reserved_bytes), format_size(r.replayed.figures.peak_reserved_bytes)),
        ("peak allocated", format!("{} req.", format_size(r.recorded.peak_allocated_bytes)), format_size(r.replayed.figures.peak_allocated_bytes)),
        ("out of memory", "-".into(), r.replayed.ooms.to_string()),
    ];
    for (label, a, b) in rows {
        println!("  {label:<28} {a:>16} {b:>16}");
    }
    println!(
        "  segment decisions matched {:.2}%, addresses matched {:.2}%, final state {}",
        r.segment_alloc_match * 100.0,
        r.address_match * 100.0,
        if r.final_state_match { "identical" } else { "different" }
    );
    if let Some(i) = r.first_oom_event {
        println!("  first out of memory: event {i}");
    }
    match &r.first_divergence {
        None => println!("  first divergence: none"),
        Some(d) => println!("  first divergence: event {}: {}", d.event, d.reason),
    }
    for w in &r.warnings {
        println!("  warning: {w}");
    }
}

/// A run's steps and peaks, then its explanation.
pub fn print_run(r: &RunResult) {
    let variant = r.variant.as_deref().map(|v| format!(" ({v})")).unwrap_or_default();
    println!("{}{variant} on {} ({}), settings {}", r.scenario, r.device, format_size(r.capacity_bytes), r.settings);
    let params: Vec<String> = r.parameters.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("parameters: {}", params.join(" "));
    println!("  {:<24} {:>14} {:>14} {:>14}", "step", "allocated", "reserved", "max allocated");
    for s in &r.steps {
        println!("  {:<24} {:>14} {:>14} {:>14}", s.label, format_size(s.allocated_bytes), format_size(s.reserved_bytes), format_size(s.max_allocated_bytes));
    }
    println!(
        "peak allocated {} ({} bytes), peak reserved {} ({} bytes)",
        format_size(r.peak_allocated_bytes),
        r.peak_allocated_bytes,
        format_size(r.peak_reserved_bytes),
        r.peak_reserved_bytes
    );
    if let Some(e) = &r.out_of_memory {
        println!("out of memory: {e}");
    }
    println!("\n{}", r.explanation);
}
