//! `tensormem predict`'s text output: the predicted peaks, how well the recordings aligned, the
//! laws that grow the most, and what to keep in mind.

use tensormem::alloc::format_size;
use tensormem::predict::{Basis, Prediction, Values, values_text};

/// Laws shown: the largest at the target.
const LAWS_SHOWN: usize = 12;

/// `recordings`: each one's label and values, in the order given.
pub fn print(p: &Prediction, recordings: &[(String, Values)]) {
    let from: Vec<String> = recordings.iter().map(|(label, values)| format!("{label} ({})", values_text(values))).collect();
    println!("prediction at {} from {}", values_text(&p.target), from.join(", "));
    if p.weak {
        println!("  WEAK: one recording, so each size's growth is guessed from its factors (see the notes)");
    }
    let (reference, _) = &recordings[p.reference];
    println!(
        "  events scaled from {} (device {}), {} events replayed from an empty device, settings {}",
        reference, p.devices[p.reference], p.events, p.settings
    );
    println!("  {:<16} {} ({} bytes)", "peak allocated", format_size(p.peak_allocated_bytes), p.peak_allocated_bytes);
    println!("  {:<16} {} ({} bytes)", "peak reserved", format_size(p.peak_reserved_bytes), p.peak_reserved_bytes);
    println!("  {:<16} {}", "peak phase", p.peak_phase.as_deref().unwrap_or("unknown"));
    match &p.out_of_memory {
        Some(message) => println!("  OUT OF MEMORY: {message}"),
        None => println!("  {:<16} none", "out of memory"),
    }
    println!("  {:<16} {:.2}% of allocations; {} unaligned", "aligned", 100.0 * p.aligned_fraction, format_size(p.unaligned_bytes));
    let h = &p.how_sure;
    println!(
        "  {:<16} {:.1}% of the bytes at the peak rest on laws a recording checks ({}); {} on laws only fitted through the recordings; {} at a recorded size",
        "how sure",
        100.0 * h.checked_share,
        format_size(h.checked_bytes),
        format_size(h.extrapolated_bytes),
        format_size(h.recorded_size_bytes)
    );
    if let Some(warning) = &h.warning {
        println!("  WARNING: {warning}");
    }
    for warning in &p.warnings {
        println!("  WARNING: {warning}");
    }
    if let Some(f) = &p.fit {
        let largest = |v: Option<u64>| match v {
            None => format!("none (not even {}=1)", f.variable),
            Some(v) if v >= f.search_limit => format!("{}={v} or more (the search's limit)", f.variable),
            Some(v) => format!("{}={v}", f.variable),
        };
        println!("  largest that fits {} ({} predictions replayed):", format_size(f.capacity_bytes), f.replays);
        println!("    {:<40} {}", f.settings, largest(f.largest));
        println!("    {:<40} {}", f.expandable_settings, largest(f.largest_expandable));
        if let Some(warning) = &f.warning {
            println!("  WARNING: {warning}");
        }
    }
    println!();
    let growing: Vec<_> = p.laws.iter().filter(|l| !l.constant).collect();
    println!("what grows (bytes at the target, per stack and law; {} of {} shown):", LAWS_SHOWN.min(growing.len()), growing.len());
    for law in growing.iter().take(LAWS_SHOWN) {
        let basis = match law.basis {
            Basis::Fitted => "",
            Basis::Factors => " (guessed from factors)",
            Basis::Unfitted => " (no law fits: recorded size)",
            Basis::Unaligned => " (unaligned: recorded size)",
            Basis::Neighbour => " (unaligned: its aligned neighbour's law)",
        };
        println!("  {:>12}  {:>5} x {}{}  {}", format_size(law.target_bytes), law.allocations, law.law, basis, law.stack);
    }
    let constant: Vec<_> = p.laws.iter().filter(|l| l.constant).collect();
    let (count, bytes) = constant.iter().fold((0, 0), |(n, b), l| (n + l.allocations, b + l.target_bytes));
    println!("  and {count} allocation(s) of constant size in {} stack(s), {} in all", constant.len(), format_size(bytes));
    for note in &p.notes {
        println!("note: {note}");
    }
}
