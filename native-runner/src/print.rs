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
        ("out of memory", r.recorded_oom.as_ref().map_or("-".into(), |o| format!("at event {}", o.event)), r.replayed.ooms.to_string()),
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
    if let Some(o) = &r.recorded_oom {
        let free = o.device_free_bytes.map(|f| format!(" with {} free", format_size(f))).unwrap_or_default();
        print!("  PyTorch ran out of memory at event {} asking for {}{free}", o.event, format_size(o.request_bytes));
        match (r.capacity, o.capacity_estimate_bytes) {
            (Some(_), _) if r.first_oom_event == Some(o.event) => println!(": reproduced"),
            (Some(_), _) => println!(": not reproduced at this capacity"),
            (None, Some(estimate)) => println!(
                "; the card is unlimited here: --capacity {estimate} (reserved then plus that free memory, {}) replays the failure",
                format_size(estimate)
            ),
            (None, None) => println!("; the card is unlimited here: give --capacity to replay the failure"),
        }
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
    let width = r.steps.iter().map(|s| s.label.len()).max().unwrap_or(0).max(24);
    println!("  {:<width$} {:>14} {:>14} {:>14}", "step", "allocated", "reserved", "max allocated");
    for s in &r.steps {
        println!(
            "  {:<width$} {:>14} {:>14} {:>14}",
            s.label,
            format_size(s.allocated_bytes),
            format_size(s.reserved_bytes),
            format_size(s.max_allocated_bytes)
        );
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
    print_ranks(r);
    println!("\n{}", r.explanation);
}

/// One line per rank, or per run of ranks that allocate alike; the heaviest rank named.
fn print_ranks(r: &RunResult) {
    let Some(heaviest) = r.ranks.iter().max_by_key(|k| (k.peak_allocated_bytes, std::cmp::Reverse(k.rank))) else { return };
    println!("\nranks (the run's steps above are rank {}'s):", r.parameters.get("rank").and_then(|v| v.as_u64()).unwrap_or(0));
    println!("  {:<12} {:>14} {:>14}  at the peak", "rank", "peak allocated", "peak reserved");
    let mut start = 0;
    while start < r.ranks.len() {
        let first = &r.ranks[start];
        let alike = |k: &&tensormem::scenarios::RankResult| {
            k.peak_allocated_bytes == first.peak_allocated_bytes && k.peak_reserved_bytes == first.peak_reserved_bytes && k.by_category == first.by_category
        };
        let end = start + r.ranks[start..].iter().take_while(alike).count();
        let ranks = if end - start == 1 { first.rank.to_string() } else { format!("{}-{}", first.rank, r.ranks[end - 1].rank) };
        let mut by: Vec<_> = first.by_category.iter().collect();
        by.sort_by_key(|(_, b)| std::cmp::Reverse(**b));
        let by: Vec<String> = by.iter().map(|(c, b)| format!("{c} {}", format_size(**b))).collect();
        let oom = if first.out_of_memory.is_some() { "  OUT OF MEMORY" } else { "" };
        println!("  {ranks:<12} {:>14} {:>14}  {}{oom}", format_size(first.peak_allocated_bytes), format_size(first.peak_reserved_bytes), by.join(", "));
        start = end;
    }
    println!("heaviest: rank {} ({})", heaviest.rank, format_size(heaviest.peak_allocated_bytes));
}
