//! The doctor over the whole scenario library: each scenario that teaches a mistake is diagnosed
//! with the kind it teaches, as its first or second problem (after the `peak` summary; the
//! informational `outside-allocator` is always last, so it never pushes a taught kind down), and its
//! fix is not. The table is printed (`cargo test --test doctor_scenarios -- --nocapture`).

mod common;

use tensormem::doctor::{self, Diagnosis, DoctorOptions};
use tensormem::scenarios::{self, RunRequest, RunResult};

use common::taught::TAUGHT;

/// Scenarios left out of the table, and why.
const LEFT_OUT: [(&str, &str); 10] = [
    ("grad-accumulation", "a technique that lowers the peak (activations per micro-batch): the peak finding shows it, no problem kind"),
    ("checkpointing", "a technique that lowers the peak (block inputs kept, recomputed in backward): the peak finding shows it"),
    ("mixed-precision", "the mistake (loss outside autocast) costs accuracy, not memory: it holds less"),
    (
        "contiguous",
        "a seed whose variants hold the same memory (the lesson: contiguous() costs one copy, not memory per step); both show `temporaries` (x = x + 1 keeps the old x)",
    ),
    (
        "alloc-in-loop",
        "a seed whose variants hold the same memory (the lesson: the cache makes the per-iteration buffer cheap, not a leak); both are `intermediates`",
    ),
    ("lm-train", "a prediction of a training step (and gpt2-train): no mistake to find"),
    ("cuda-graph-step", "modes, not a mistake and its fix, and no H100 twin yet: cuda_graphs_are_diagnosed_private_pools checks it"),
    ("cuda-graph-pools", "modes, not a mistake and its fix, and no H100 twin yet: cuda_graphs_are_diagnosed_private_pools checks it"),
    ("hf-train", "a prediction of a Hugging Face model's training step: no mistake to find"),
    (
        "hf-generate",
        "a prediction of generation (no variants); at its defaults (batch 1, prompt 512, new 256) the prefill's freed attention scores absorb \
         the dynamic cache's cats, so no fragmentation; tests/hf_generate.rs checks that a long generation (batch 8, prompt 16, new 1,024) \
         is diagnosed `fragmentation` with cache=dynamic and not with cache=static",
    ),
];

fn run(scenario: &str, variant: Option<&str>) -> (RunResult, Diagnosis) {
    let request = RunRequest { scenario: scenario.into(), variant: variant.map(str::to_string), ..Default::default() };
    let run = scenarios::run(&request).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let d = doctor::diagnose(&run.snapshot, &DoctorOptions::default()).unwrap();
    (run, d)
}

fn diagnose(scenario: &str, variant: Option<&str>) -> Diagnosis {
    run(scenario, variant).1
}

/// Where `kind` is among the problems (1: first after `peak`), if anywhere.
fn rank(d: &Diagnosis, kind: &str) -> Option<usize> {
    d.findings.iter().skip(1).position(|f| f.kind == kind).map(|i| i + 1)
}

#[test]
fn each_scenario_is_diagnosed_with_the_kind_it_teaches() {
    let mut table = vec![format!(
        "{:<22} {:<8} {:<16} {:<7} {:<8} {:<24} {}",
        "scenario", "variant", "expected kind", "found", "verdict", "peak allocated", "problems after peak"
    )];
    let mut failures = Vec::new();
    for (scenario, kind) in TAUGHT {
        let info = scenarios::find(scenario).unwrap_or_else(|| panic!("no scenario {scenario}"));
        let runs: Vec<(Option<&str>, RunResult, Diagnosis)> = if info.variants.is_empty() {
            let (r, d) = run(scenario, None);
            vec![(None, r, d)]
        } else {
            // The mistake's findings that the fix removes, verified by the fix's run.
            let request = RunRequest { scenario: scenario.to_string(), variant: Some("mistake".into()), ..Default::default() };
            let diagnosed = scenarios::diagnose(&request, &DoctorOptions::default()).unwrap_or_else(|e| panic!("{scenario}: {e}"));
            let (fix, fixed) = diagnosed.fix.expect("a mistake's fix is run and diagnosed");
            vec![(Some("mistake"), diagnosed.run, diagnosed.diagnosis), (Some("fix"), fix, fixed)]
        };
        for (variant, result, d) in &runs {
            let problems: Vec<&str> = d.findings.iter().skip(1).map(|f| f.kind.as_str()).collect();
            let found = rank(d, kind);
            let mut ok = match variant {
                Some("fix") => found.is_none(),
                _ => found.is_some_and(|r| r <= 2),
            };
            let mut peaks = format!("{}", result.peak_allocated_bytes);
            if *variant == Some("mistake") {
                // The taught finding is verified by the fix's run, which peaks lower.
                let v = found.and_then(|r| d.findings[r].verified.as_ref());
                ok &= v.is_some_and(|v| {
                    v.after_peak_allocated_bytes < v.before_peak_allocated_bytes || v.after_peak_reserved_bytes < v.before_peak_reserved_bytes
                });
                if let Some(v) = v {
                    peaks = format!("{} -> {}", v.before_peak_allocated_bytes, v.after_peak_allocated_bytes);
                }
            }
            let verdict = found.map_or("absent".to_string(), |r| format!("#{r}"));
            table.push(format!(
                "{:<22} {:<8} {:<16} {:<7} {:<8} {:<24} {}",
                scenario,
                variant.unwrap_or("-"),
                kind,
                verdict,
                if ok { "ok" } else { "WRONG" },
                peaks,
                problems.join(", ")
            ));
            if !ok {
                failures.push(format!("{scenario} {}: {kind} {verdict}", variant.unwrap_or("-")));
            }
        }
    }
    eprintln!("{}", table.join("\n"));
    eprintln!("left out:\n{}", LEFT_OUT.iter().map(|(s, why)| format!("  {s}: {why}")).collect::<Vec<_>>().join("\n"));
    // Every scenario of the library is in the table or left out with a reason.
    for info in scenarios::list() {
        let named = TAUGHT.iter().any(|(s, _)| *s == info.name) || LEFT_OUT.iter().any(|(s, _)| *s == info.name) || info.name == "gpt2-train";
        assert!(named, "{} is neither in the table nor left out", info.name);
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_flat_loop_shows_no_growth_and_steady_optimizer_state_is_not_growth() {
    // Adam's moments appear at the first step and stay: optimizer-state, not growth.
    for scenario in ["optimizer-state", "grad-accumulation", "mixed-precision"] {
        let variant = scenarios::find(scenario).unwrap().variants.first().map(|_| "fix");
        let d = diagnose(scenario, variant);
        assert!(rank(&d, doctor::GROWTH).is_none(), "{scenario}: {:?}", d.findings.iter().map(|f| &f.kind).collect::<Vec<_>>());
    }
    let d = diagnose("optimizer-state", None);
    let f = d.findings.iter().find(|f| f.kind == doctor::OPTIMIZER_STATE).unwrap();
    // Adam: two moments, each the size of the parameters, made once (in place after that).
    assert_eq!(f.evidence.json()["state_bytes"], 2 * f.evidence.json()["parameter_bytes"].as_u64().unwrap());
    assert_eq!(f.evidence.json()["made_anew_each_step"], false);
    let momentum = diagnose_with("optimizer-state", None, "optimizer", "momentum");
    let f = momentum.findings.iter().find(|f| f.kind == doctor::OPTIMIZER_STATE).unwrap();
    assert_eq!(f.evidence.json()["state_bytes"], f.evidence.json()["parameter_bytes"]);
    let sgd = diagnose_with("optimizer-state", None, "optimizer", "sgd");
    assert!(rank(&sgd, doctor::OPTIMIZER_STATE).is_none(), "plain SGD keeps nothing");

    // A language model's training loop over 4 steps after its warm-up: flat, nothing kept.
    let d = diagnose_with("lm-train", None, "steps", "4");
    for kind in [doctor::GROWTH, doctor::RETAINED_GRAPH, doctor::GRADS_KEPT, doctor::MISSING_NO_GRAD] {
        assert!(rank(&d, kind).is_none(), "lm-train: {kind}");
    }
    assert!(rank(&d, doctor::OPTIMIZER_STATE).is_some());
}

#[test]
fn the_variants_parameters_move_the_verdict() {
    // zero_grad(set_to_none=False) keeps the gradient blocks (zeroed) through the forward.
    let d = diagnose_with("zero-grad", Some("fix"), "set_to_none", "false");
    assert_eq!(rank(&d, doctor::GRADS_KEPT), Some(1));
    assert_eq!(
        d.findings[1].bytes,
        d.findings[0].evidence.json()["live"]["by_group"].as_array().unwrap().iter().find(|g| g["kind"] == "parameter").unwrap()["bytes"].as_u64().unwrap(),
        "one gradient per parameter"
    );
    // inference_mode keeps no graph either: what remains is what no_grad leaves, byte for byte.
    // Each op's arguments go when it returns, as in Python, so no hidden temporary is left at
    // the peak: only the information on what the peak holds.
    let d = diagnose_with("eval-no-grad", Some("fix"), "guard", "inference_mode");
    let no_grad = diagnose_with("eval-no-grad", Some("fix"), "guard", "no_grad");
    let kinds_bytes = |d: &Diagnosis| d.findings.iter().map(|f| (f.kind.clone(), f.bytes)).collect::<Vec<_>>();
    assert_eq!(kinds_bytes(&d), kinds_bytes(&no_grad));
    assert_eq!(d.findings.iter().map(|f| f.kind.as_str()).collect::<Vec<_>>(), [doctor::PEAK, doctor::INTERMEDIATES, doctor::OUTSIDE_ALLOCATOR]);
    // A forward-only loop that keeps its losses keeps every graph: retained, growing, and never
    // used (the cache it leaves, no setting recovers enough to report).
    let d = diagnose_with("loss-history", Some("mistake"), "backward", "false");
    let kinds: Vec<&str> = d.findings.iter().skip(1).map(|f| f.kind.as_str()).collect();
    assert_eq!(kinds, [doctor::RETAINED_GRAPH, doctor::MISSING_NO_GRAD, doctor::GROWTH, doctor::OUTSIDE_ALLOCATOR]);
}

/// `scenario`'s `variant` (None: the default) with one parameter set.
fn diagnose_with(scenario: &str, variant: Option<&str>, key: &str, value: &str) -> Diagnosis {
    let request = RunRequest {
        scenario: scenario.into(),
        variant: variant.map(str::to_string),
        set: [(key.to_string(), value.to_string())].into_iter().collect(),
        ..Default::default()
    };
    let run = scenarios::run(&request).unwrap();
    doctor::diagnose(&run.snapshot, &DoctorOptions::default()).unwrap()
}

#[test]
fn growth_gives_its_rate_and_when_the_card_runs_out() {
    // grad-fn-history keeps one forward's graph per step: the rate is one graph, the same stacks.
    let d = diagnose("grad-fn-history", Some("mistake"));
    let g = d.findings.iter().find(|f| f.kind == doctor::GROWTH).unwrap();
    let e = &g.evidence.json();
    assert_eq!(e["iterations"], 4);
    let kept: Vec<u64> = serde_json::from_value(e["kept_per_iteration"].clone()).unwrap();
    assert!(kept.windows(2).all(|w| w[0] == w[1]), "{kept:?}");
    let rate = e["bytes_per_iteration"].as_u64().unwrap();
    assert_eq!(rate, kept[0]);
    // missing-no-grad measures the same forward's saved tensors, less its result, at its end,
    // where the last op's inputs are live too (within 5%).
    let m = d.findings.iter().find(|f| f.kind == doctor::MISSING_NO_GRAD).unwrap();
    assert!(m.bytes >= rate && m.bytes - rate <= rate / 20, "{} vs {rate}", m.bytes);
    assert!(e["capacity_source"].as_str().unwrap().contains("H100-80GB"));
    let peak = d.findings[0].bytes;
    assert_eq!(e["runs_out_at_iteration"], 4 + (85_045_379_072 - peak) / rate + 1);
    assert!(g.estimate.is_some());
}

#[test]
fn every_scenario_and_variant_gives_the_peak_first_then_known_kinds_by_bytes() {
    for info in scenarios::list() {
        let variants: Vec<Option<&str>> = if info.variants.is_empty() { vec![None] } else { info.variants.iter().map(|v| Some(*v)).collect() };
        for variant in variants {
            let name = format!("{} {}", info.name, variant.unwrap_or("-"));
            let d = diagnose(info.name, variant);
            assert_eq!(d.findings[0].kind, doctor::PEAK, "{name}");
            assert!(d.findings[1..].iter().all(|f| f.kind != doctor::PEAK && doctor::KINDS.contains(&f.kind.as_str())), "{name}");
            // `outside-allocator` is information, ranked last whatever its (estimated) bytes.
            assert_eq!(d.findings.last().map(|f| f.kind.as_str()), Some(doctor::OUTSIDE_ALLOCATOR), "{name}");
            // Problems by bytes, an out-of-memory error first whatever its request (information
            // and inconclusive findings are not ranked).
            let ranked =
                |f: &&doctor::Finding| f.kind != doctor::OOM && !f.is_inconclusive() && doctor::kind(&f.kind).is_some_and(|k| k.role == doctor::Role::Problem);
            let problems: Vec<&doctor::Finding> = d.findings[1..].iter().filter(ranked).collect();
            assert!(problems.windows(2).all(|w| w[0].bytes >= w[1].bytes), "{name}: not ranked by bytes");
            assert!(d.findings.iter().position(|f| f.kind == doctor::OOM).is_none_or(|i| i == 1), "{name}: the oom first");
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(serde_json::from_str::<Diagnosis>(&json).unwrap(), d, "{name}");
        }
    }
}

/// The seeds' findings in bytes the shapes make exact (float32: 4 bytes an element).
#[test]
fn the_seeds_findings_name_their_bytes() {
    let finding = |d: &Diagnosis, kind: &str| d.findings.iter().find(|f| f.kind == kind).cloned().unwrap_or_else(|| panic!("no {kind}"));
    // matmul(x, x.T) of a 1000^3 tensor: ATen copies the permuted operand (4 GB) for cuBLAS.
    let d = diagnose("seed-basics", None);
    let copies = finding(&d, doctor::COPIES);
    assert_eq!(copies.bytes, 4 * 1000 * 1000 * 1000);
    assert_eq!(copies.evidence.json()["at_peak_by_op"][0]["op"], "clone");
    assert_eq!(copies.evidence.json()["allocations"][0]["trace_index"], 3, "the copy is the trace's second allocation (after randn's segment)");
    // clone(), t().reshape(-1) and t().contiguous() of a 2048 x 2048 tensor: three copies; the
    // views and contiguous() of a contiguous tensor add nothing.
    let d = diagnose("views-vs-copies", None);
    let copies = finding(&d, doctor::COPIES);
    assert_eq!(copies.bytes, 3 * 2048 * 2048 * 4);
    assert_eq!(copies.evidence.json()["made_by_op"][0]["allocations"], 3);
    // x = x + 1 on 1000 x 1000: the old x (4 MB) is kept while the new one is made.
    let d = diagnose("inplace-chain", Some("mistake"));
    let t = finding(&d, doctor::TEMPORARIES);
    assert_eq!((t.bytes, t.evidence.json()["replaced_bytes"].as_u64(), t.evidence.json()["temporary_bytes"].as_u64()), (4_000_000, Some(4_000_000), Some(0)));
    assert_eq!(t.evidence.json()["allocations"][0]["group"], "randn (scenarios/seeds.rs:171)");
    // y.expand_as(x).contiguous() on 1000 x 1000 x 100: one full-size copy before the add.
    let d = diagnose("broadcast-temporaries", Some("mistake"));
    assert_eq!(finding(&d, doctor::COPIES).bytes, 1000 * 1000 * 100 * 4);
    // a + b, matmul(1000x2000, 2000x500) and add_: the peak is the matmul's inputs (8 MB + 4 MB)
    // and its output (2 MB), nothing hidden.
    let d = diagnose("intermediates", None);
    assert_eq!(d.findings.iter().map(|f| f.kind.as_str()).collect::<Vec<_>>(), [doctor::PEAK, doctor::INTERMEDIATES, doctor::OUTSIDE_ALLOCATOR]);
    let i = finding(&d, doctor::INTERMEDIATES);
    assert_eq!(i.bytes, 1000 * 500 * 4);
    assert_eq!(i.evidence.json()["outputs_by_op"], serde_json::json!([["matmul", 2_000_000]]));
    assert_eq!(i.evidence.json()["data_by_op"], serde_json::json!([["randn", 12_000_000]]));
    // In place, or broadcasting, there is nothing to find.
    for (scenario, kind) in [("inplace-chain", doctor::TEMPORARIES), ("broadcast-temporaries", doctor::COPIES)] {
        let d = diagnose(scenario, Some("fix"));
        assert_eq!(d.findings[1].kind, doctor::INTERMEDIATES, "{scenario}: no problem, so the peak by op");
        assert!(rank(&d, kind).is_none(), "{scenario}");
    }
}

#[test]
fn deliberate_gradient_accumulation_is_not_gradients_kept() {
    // rnn-hidden's fix accumulates gradients over its batches and steps once, at the end. Its
    // trace carries the step's range, as torch.optim records it (plain SGD allocates nothing):
    // no step comes between the backwards, so the gradients alive through the next forward are
    // accumulating, not kept.
    let (fix, d) = run("rnn-hidden", Some("fix"));
    let notes = fix.snapshot.external_annotations.clone().unwrap_or_default();
    let steps: Vec<&str> = notes.iter().map(|n| n.stage.as_str()).collect();
    assert_eq!(steps, ["START", "END"], "one optimizer step: {notes:?}");
    assert!(notes.iter().all(|n| n.name == "Optimizer.step#SGD.step" && n.time_us.is_some()));
    assert!(rank(&d, doctor::GRADS_KEPT).is_none(), "{:?}", d.findings.iter().map(|f| &f.kind).collect::<Vec<_>>());
    // zero-grad's mistake steps between its backwards, with nothing freeing the gradients.
    let (mistake, d) = run("zero-grad", Some("mistake"));
    assert_eq!(mistake.snapshot.external_annotations.as_ref().map_or(0, Vec::len), 2 * 4, "four steps, each a range");
    assert_eq!(rank(&d, doctor::GRADS_KEPT), Some(1));
}

#[test]
fn cuda_graphs_are_diagnosed_private_pools() {
    let finding = |d: &Diagnosis| d.findings.iter().find(|f| f.kind == doctor::PRIVATE_POOLS).cloned();
    // The captured step: its pool's 128 MiB of free blocks, which releasing the graph returns.
    let d = diagnose("cuda-graph-step", None);
    assert_eq!(rank(&d, doctor::PRIVATE_POOLS), Some(1), "{:?}", d.findings.iter().map(|f| &f.kind).collect::<Vec<_>>());
    let f = finding(&d).unwrap();
    assert_eq!(f.bytes, 128 << 20);
    assert_eq!(f.evidence.json()["private_reserved_bytes"], 192u64 << 20);
    assert_eq!(f.evidence.json()["returned_if_released_bytes"], 128u64 << 20);
    assert_eq!(f.evidence.json()["pools"][0]["pool"], serde_json::json!([1, 0]));
    assert!(f.fix.contains("empty_cache() then returns 128.00 MiB"), "{}", f.fix);
    // The same step eager has no pool to speak of.
    let eager = run_with("cuda-graph-step", &[("mode", "eager")]);
    assert!(finding(&eager).is_none());
    // Graphs for four batch sizes: their own pools hold more free than one shared pool does.
    let own = finding(&run_with("cuda-graph-pools", &[])).unwrap();
    let shared = finding(&run_with("cuda-graph-pools", &[("pools", "shared")])).unwrap();
    assert_eq!((own.bytes, shared.bytes), (64 << 20, 30 << 20));
    assert_eq!(own.evidence.json()["pools"].as_array().unwrap().len(), 4);
    assert_eq!(shared.evidence.json()["pools"].as_array().unwrap().len(), 1);
}

fn run_with(scenario: &str, set: &[(&str, &str)]) -> Diagnosis {
    let request = RunRequest { scenario: scenario.into(), set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Default::default() };
    let run = scenarios::run(&request).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    doctor::diagnose(&run.snapshot, &DoctorOptions::default()).unwrap()
}
