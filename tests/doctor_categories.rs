//! Inferred categories (`doctor::infer_categories`) against the categories tensormem records:
//! over every scenario and variant of the library, the categories are stripped, inferred from
//! stacks, phases and lifetimes alone, and compared with the recorded ones. tensormem records
//! `parameter`, `optimizer_state` and `input` (the other allocations carry none, so only those
//! three are scored; coverage is printed). `cargo test --test doctor_categories -- --nocapture`
//! prints the confusion table.

mod common;

use std::collections::BTreeMap;
use tensormem::doctor;
use tensormem::scenarios::{self, RunRequest};
use tensormem::trace::{Category, Snapshot};

fn run(scenario: &str, variant: Option<&str>) -> Snapshot {
    let request = RunRequest { scenario: scenario.into(), variant: variant.map(str::to_string), ..Default::default() };
    scenarios::run(&request).unwrap_or_else(|e| panic!("{scenario}: {e}")).snapshot
}

#[derive(Default)]
struct Tally {
    count: u64,
    bytes: u64,
}

#[test]
fn inferred_categories_agree_with_the_recorded_ones_over_the_scenario_library() {
    // (recorded, inferred) -> allocations and bytes.
    let mut confusion: BTreeMap<(&str, &str), Tally> = BTreeMap::new();
    let (mut all, mut all_bytes, mut runs) = (0u64, 0u64, 0);
    let mut misses: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // What the allocations without a recorded category are inferred to be.
    let mut unscored: BTreeMap<&str, Tally> = BTreeMap::new();
    for info in scenarios::list() {
        let variants: Vec<Option<&str>> = if info.variants.is_empty() { vec![None] } else { info.variants.iter().map(|v| Some(*v)).collect() };
        for variant in variants {
            let name = format!("{} {}", info.name, variant.unwrap_or("-"));
            let recorded = run(info.name, variant);
            let mut stripped = recorded.clone();
            for t in &mut stripped.device_traces {
                for e in t.iter_mut() {
                    e.category = None;
                }
            }
            runs += 1;
            for device in recorded.devices() {
                let trace = recorded.trace_of(device);
                for a in doctor::infer_categories(&stripped, device).unwrap() {
                    let Some(i) = a.trace_index else { continue };
                    all += 1;
                    all_bytes += a.bytes;
                    let Some(c) = trace[i].category else {
                        let t = unscored.entry(a.inferred.name()).or_default();
                        t.count += 1;
                        t.bytes += a.bytes;
                        continue;
                    };
                    let tally = confusion.entry((c.name(), a.inferred.name())).or_default();
                    tally.count += 1;
                    tally.bytes += a.bytes;
                    let key = format!("{name} {} {}", c.name(), a.inferred.name());
                    if a.inferred.category != Some(c) && seen.insert(key) {
                        let top = trace[i].frames.as_ref().map(|f| f.iter().map(|f| format!("{} {}", f.name, f.filename)).collect::<Vec<_>>().join(" / "));
                        misses.push(format!(
                            "{name} #{i}/{} end {:?} {} recorded {} inferred {} ({}) {top:?}",
                            trace.len(),
                            trace.iter().skip(i).position(|e| e.addr == a.address && e.action == tensormem::trace::Action::FreeCompleted),
                            a.bytes,
                            c.name(),
                            a.inferred.name(),
                            a.inferred.reason
                        ));
                    }
                }
            }
        }
    }
    eprintln!("{:<16} {:<16} {:>9} {:>16}", "recorded", "inferred", "count", "bytes");
    for ((r, i), t) in &confusion {
        eprintln!("{r:<16} {i:<16} {:>9} {:>16}", t.count, t.bytes);
    }
    let scored = |f: &dyn Fn(&str, &str) -> bool| -> (u64, u64) {
        confusion.iter().filter(|((r, i), _)| f(r, i)).fold((0, 0), |(c, b), (_, t)| (c + t.count, b + t.bytes))
    };
    let (count, bytes) = scored(&|_, _| true);
    let (agree, agree_bytes) = scored(&|r, i| r == i);
    eprintln!(
        "{runs} runs; {count} of {all} allocations ({:.1}%, {:.1}% of bytes) carry a recorded category",
        100.0 * count as f64 / all as f64,
        100.0 * bytes as f64 / all_bytes as f64
    );
    let by_count = agree as f64 / count as f64;
    let by_bytes = agree_bytes as f64 / bytes as f64;
    eprintln!("agreement: {:.2}% by count, {:.2}% by bytes", 100.0 * by_count, 100.0 * by_bytes);
    for c in Category::ALL {
        let (n, b) = scored(&|r, _| r == c.name());
        let (k, kb) = scored(&|r, i| r == c.name() && i == c.name());
        if n > 0 {
            eprintln!("  {:<16} {k}/{n} ({:.2}%), bytes {:.2}%", c.name(), 100.0 * k as f64 / n as f64, 100.0 * kb as f64 / b as f64);
        }
    }
    eprintln!("allocations without a recorded category, inferred:");
    for (i, t) in &unscored {
        eprintln!("  {i:<16} {:>9} {:>16}", t.count, t.bytes);
    }
    for m in &misses {
        eprintln!("miss: {m}");
    }
    // Measured: 79.49% by count, 90.92% by bytes. Every miss but one is HandwrittenAdamW's
    // `state.get(key, zeros_like(p))` in lm-train: zeros tagged as state that the step drops
    // at once (a temporary by lifetime), 876 allocations; the other is rnn-hidden's first hidden
    // state, made before the loop and kept to the end (inferred a parameter).
    assert!(by_count >= 0.78, "agreement by count {by_count}");
    assert!(by_bytes >= 0.90, "agreement by bytes {by_bytes}");
    let share = |c: &str| scored(&|r, i| r == c && i == c).1 as f64 / scored(&|r, _| r == c).1 as f64;
    assert!(share("parameter") >= 0.99 && share("input") >= 0.99 && share("optimizer_state") >= 0.84);
}
