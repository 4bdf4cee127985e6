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

/// The evidence's figures, the live groups, and the largest stack, where the finding has them.
fn print_evidence(f: &Finding) {
    let Some(e) = f.evidence.as_object() else { return };
    let figures: Vec<String> = e
        .iter()
        .filter(|(k, v)| v.is_u64() && (k.contains("bytes") || ["event", "position", "device", "iterations"].contains(&k.as_str())))
        .map(|(k, v)| if k.contains("bytes") { format!("{k} {}", format_size(v.as_u64().unwrap_or(0))) } else { format!("{k} {v}") })
        .collect();
    if !figures.is_empty() {
        println!("  evidence: {}", figures.join(", "));
    }
    if let Some(live) = e.get("live") {
        for g in live["by_group"].as_array().into_iter().flatten().take(5) {
            let count = g["allocations"].as_u64().unwrap_or(0);
            let plural = if count == 1 { "" } else { "s" };
            println!("    {:>12}  {} ({count} allocation{plural})", format_size(g["bytes"].as_u64().unwrap_or(0)), g["name"].as_str().unwrap_or(""));
        }
    }
    // The stack holding the most: of what was live (peak, oom), or of what the finding names.
    let stacks = e.get("live").map_or(e.get("top_stacks"), |live| live.get("top_stacks"));
    if let Some(stack) = stacks.and_then(|s| s.as_array()).and_then(|s| s.first()) {
        println!("    largest stack, {}:", format_size(stack["bytes"].as_u64().unwrap_or(0)));
        for frame in stack["frames"].as_array().into_iter().flatten().filter_map(|f| f.as_str()) {
            println!("      {frame}");
        }
    }
    for w in e.get("what_ifs").and_then(|w| w.as_array()).into_iter().flatten() {
        println!(
            "    what if {}: peak reserved {} -> {}",
            w["alloc_conf"].as_str().unwrap_or(""),
            format_size(w["before_peak_reserved_bytes"].as_u64().unwrap_or(0)),
            format_size(w["after_peak_reserved_bytes"].as_u64().unwrap_or(0))
        );
    }
}
