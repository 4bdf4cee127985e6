//! `tensormem doctor`'s text output: each finding's title, then why, the fix, what a replay
//! measured, and a short summary of the evidence.

use tensormem::alloc::format_size;
use tensormem::doctor::{Diagnosis, Finding, Verified};

pub fn print(diagnosis: &Diagnosis) {
    for (n, f) in diagnosis.findings.iter().enumerate() {
        if n > 0 {
            println!();
        }
        println!("[{}] {}", f.kind, f.title);
        if let Some(reason) = &f.confidence_reason {
            println!("  confidence: {} ({reason})", serde_json::to_value(f.confidence).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default());
        }
        println!("  why: {}", f.why);
        println!("  fix: {}", f.fix);
        if let Some(v) = &f.verified {
            print_verified(v);
        }
        if let Some(e) = &f.estimate {
            println!("  estimate: {e}");
        }
        print_evidence(f);
    }
    for note in &diagnosis.notes {
        println!();
        println!("note: {note}");
    }
}

fn print_verified(v: &Verified) {
    println!("  verified: {}", v.how);
    let oom = |o: bool| if o { ", out of memory" } else { "" };
    println!(
        "    peak reserved {} -> {}, peak allocated {} -> {}{}",
        format_size(v.before_peak_reserved_bytes),
        format_size(v.after_peak_reserved_bytes),
        format_size(v.before_peak_allocated_bytes),
        format_size(v.after_peak_allocated_bytes),
        match (v.before_out_of_memory, v.after_out_of_memory) {
            (true, false) => " (out of memory before, none after)".to_string(),
            (b, a) if b || a => format!(" (before{}; after{})", oom(b), oom(a)),
            _ => String::new(),
        }
    );
    if let Some(c) = &v.command {
        println!("    check: {c}");
    }
}

/// The evidence's figures (every kind's byte counts and positions, by name), the live groups,
/// the largest stack and the settings tried.
fn print_evidence(f: &Finding) {
    let json = f.evidence.json();
    let figures: Vec<String> = json
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| v.is_u64() && (k.contains("bytes") || ["event", "position", "device", "iterations"].contains(&k.as_str())))
        .map(|(k, v)| if k.contains("bytes") { format!("{k} {}", format_size(v.as_u64().unwrap_or(0))) } else { format!("{k} {v}") })
        .collect();
    if !figures.is_empty() {
        println!("  evidence: {}", figures.join(", "));
    }
    for g in f.evidence.live().map_or(&[][..], |live| &live.by_group).iter().take(5) {
        let plural = if g.allocations == 1 { "" } else { "s" };
        println!("    {:>12}  {} ({} allocation{plural})", format_size(g.bytes), g.name, g.allocations);
    }
    // The stack holding the most: of what the finding names, or of what was live (peak, oom).
    if let Some(stack) = f.evidence.top_stacks().first() {
        println!("    largest stack, {}:", format_size(stack.bytes));
        for frame in &stack.frames {
            println!("      {frame}");
        }
    }
    for w in f.evidence.what_ifs() {
        println!("    what if {}: peak reserved {} -> {}", w.alloc_conf, format_size(w.before_peak_reserved_bytes), format_size(w.after_peak_reserved_bytes));
    }
}
