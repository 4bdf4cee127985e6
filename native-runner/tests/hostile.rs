//! Issue 30's hostile inputs, each as a user would meet it from the command line: a clear error
//! or a bounded answer, and no input file ever changed, whatever option names it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "../../tests/common/mod.rs"]
mod common;

fn tensormem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensormem")).args(args).output().expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensormem-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A small config.json (two layers) a user sizes a model with.
const CONFIG: &str = r#"{"model_type":"llama","hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":1000,"max_position_embeddings":2048}"#;

/// Runs `args`, expecting exit 2 and a refusal naming the file, with `input` unchanged.
fn refused_and_kept(args: &[&str], input: &Path) {
    let before = std::fs::read(input).unwrap();
    let out = tensormem(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    assert!(stderr(&out).contains("write the result to another file"), "{args:?}: {}", stderr(&out));
    assert_eq!(std::fs::read(input).unwrap(), before, "{args:?} changed its input");
}

#[test]
fn no_option_that_names_an_input_can_be_written_over() {
    let dir = scratch("inputs");
    let config = dir.join("config.json");
    std::fs::write(&config, CONFIG).unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&config, &link).unwrap();
    // run --set config=FILE: the config, by its name and through a link.
    for out in [&config, &link] {
        refused_and_kept(&["run", "hf-train", "--set", &format!("config={}", s(&config)), "--snapshot", s(out)], &config);
    }
    // replay FILE and predict's recordings.
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    for (path, context) in [(&a, 64), (&b, 128)] {
        let made = tensormem(&["run", "lm-train", "--set", &format!("size=small,batch=1,context={context}"), "--snapshot", s(path)]);
        assert!(made.status.success(), "{}", stderr(&made));
    }
    refused_and_kept(&["replay", s(&a), "--snapshot", s(&a)], &a);
    let (a_at, b_at) = (format!("{}@context=64", s(&a)), format!("{}@context=128", s(&b)));
    refused_and_kept(&["predict", &a_at, &b_at, "--to", "context=256", "--snapshot", s(&b)], &b);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn inputs_that_are_not_snapshots_are_read_only_as_far_as_they_can_be() {
    let compare = tensormem(&["compare", "/dev/zero", "/dev/null"]);
    assert_eq!(compare.status.code(), Some(1), "{}", stderr(&compare));
    assert!(stderr(&compare).contains("/dev/zero is larger than 64.00 MiB: not a run's JSON"), "{}", stderr(&compare));
    let run = tensormem(&["run", "hf-train", "--set", "config=/dev/zero"]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    assert!(stderr(&run).contains("/dev/zero is larger than 4.00 MiB: not a config.json"), "{}", stderr(&run));
}

#[test]
fn absurd_sizes_are_refused_with_the_limit_and_the_rest_runs() {
    let dir = scratch("absurd");
    let deep = dir.join("deep.json");
    std::fs::write(&deep, CONFIG.replace("\"num_hidden_layers\":2", "\"num_hidden_layers\":3000")).unwrap();
    for strategy in ["ddp", "fsdp"] {
        let out = tensormem(&["run", "hf-train", "--set", &format!("config={},context=8,warmup=0,strategy={strategy},world=2", s(&deep))]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("3000 layers is more than 1024"), "{}", stderr(&out));
    }
    for (args, limit) in [
        (vec!["run", "rnn-hidden", "--set", "steps=1000"], "steps must be a whole number from 1 to 128"),
        (vec!["run", "hf-generate", "--set", "prompt=1,new_tokens=1048576"], "new_tokens must be a whole number from 1 to 32768"),
        (vec!["fit", "lm-train", "--set", "steps=1000"], "warmup + steps must be at most 4"),
        (vec!["fit", "lm-train", "--set", "accumulation=1024"], "accumulation must be at most 8"),
    ] {
        let out = tensormem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(limit), "{args:?}: {}", stderr(&out));
    }
    // At their limits they run.
    let out = tensormem(&["run", "rnn-hidden", "--set", "steps=128,batch=2,timesteps=2,hidden=8"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_target_past_an_exabyte_is_refused_not_printed_as_zero() {
    let Some(dir) = common::fixtures_dir() else { return };
    let at = |name: &str, context: u64| format!("{}@context={context}", s(&dir.join(name)));
    let (a, b) = (at("gpt-medium-ctx128-inference.pickle", 128), at("gpt-medium-ctx256-inference.pickle", 256));
    for target in ["context=268435858", "context=250000000"] {
        let out = tensormem(&["predict", &a, &b, "--to", target]);
        assert_eq!(out.status.code(), Some(2), "{target}: {}", stderr(&out));
        assert!(stderr(&out).contains("would hold more than 1 EB at once"), "{target}: {}", stderr(&out));
    }
    let fine = tensormem(&["predict", &a, &b, "--to", "context=1024", "--json"]);
    assert!(fine.status.success(), "{}", stderr(&fine));
}

#[test]
fn a_file_size_limit_fails_the_write_and_leaves_no_temporary_file() {
    let dir = scratch("xfsz");
    let input = dir.join("in.json");
    let made = tensormem(&["run", "lm-train", "--set", "size=small,batch=1,context=64", "--snapshot", s(&input)]);
    assert!(made.status.success(), "{}", stderr(&made));
    let old = dir.join("old.pickle");
    std::fs::write(&old, b"old").unwrap();
    // 100 blocks of 512 bytes: far less than the snapshot.
    let script = format!("ulimit -f 100; exec '{}' replay '{}' --snapshot '{}'", env!("CARGO_BIN_EXE_tensormem"), s(&input), s(&old));
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "killed by a signal instead? {:?} {}", out.status, stderr(&out));
    assert!(stderr(&out).contains("File too large"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&old).unwrap(), b"old");
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "only the input and the old file: {names:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A config.json of `layers` tiny layers: the cost of a run is its layer count, not its sizes.
fn tiny_layers(dir: &Path, layers: u32) -> PathBuf {
    let path = dir.join(format!("layers-{layers}.json"));
    let config = format!(
        r#"{{"model_type":"llama","hidden_size":8,"intermediate_size":8,"num_hidden_layers":{layers},"num_attention_heads":1,"num_key_value_heads":1,"vocab_size":8}}"#
    );
    std::fs::write(&path, config).unwrap();
    path
}

#[test]
fn the_product_of_legal_parameters_is_bounded_by_one_budget_before_anything_runs() {
    let dir = scratch("budget");
    let deep = tiny_layers(&dir, 1024);
    let generate = format!("config={},new_tokens=32768,prompt=1", s(&deep));
    let generate_at_budget = format!("config={},new_tokens=513,prompt=1", s(&deep));
    let fit_deep = format!("config={}", s(&deep));
    for (args, said) in [
        // steps 1000 and accumulation 1024 are each legal: 49 million layer passes are not.
        (
            vec!["run", "lm-train", "--set", "size=small,steps=1000,accumulation=1024"],
            "49,201,152 layer passes (steps with warm-up 1001 x accumulation 1024 x layers 12 x 4)",
        ),
        (vec!["run", "hf-generate", "--set", generate.as_str()], "33,554,432 layer passes (layers 1024 x tokens generated 32768)"),
        (vec!["run", "hf-generate", "--set", generate_at_budget.as_str()], "525,312 layer passes"),
        (vec!["run", "rnn-hidden", "--set", "steps=128,timesteps=4096"], "33,816,576 layer passes (batches walked by backward 8256 x timesteps 4096)"),
        (vec!["run", "grad-accumulation", "--variant", "fix", "--set", "micro_batches=4096,steps=1000"], "65,536,000 layer passes"),
        (vec!["fit", "hf-train", "--set", fit_deep.as_str(), "--vary", "context"], "this table would take up to"),
    ] {
        let start = std::time::Instant::now();
        let out = tensormem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("more than the 524,288"), "{args:?}: {}", stderr(&out));
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "{args:?} was refused only after {:?}", start.elapsed());
    }
    // One token fewer is within the budget: the next check speaks (the card), and nothing runs.
    let out = tensormem(&["run", "hf-generate", "--set", &format!("config={},new_tokens=512,prompt=1", s(&deep)), "--device", "sim:no-such-card"]);
    assert!(stderr(&out).contains("unknown device"), "the next check, not the budget: {}", stderr(&out));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_fit_table_names_each_strategy_and_card_once_and_has_a_bounded_size() {
    let cards: Vec<String> = (1..=200).map(|g| format!("{g}GiB")).collect();
    for (args, said) in [
        (vec!["fit", "lm-train", "--set", "world=2", "--strategies", "ddp,zero1,ddp", "--cards", "A100-40GB"], "strategies: ddp is named twice"),
        (vec!["fit", "lm-train", "--set", "world=2", "--cards", "A100-40GB,H100-80GB,A100-40GB"], "cards: A100-40GB is named twice"),
        (vec!["fit", "lm-train", "--cards", &cards.join(",")], "800 cells, more than 36"),
    ] {
        let out = tensormem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn an_output_in_a_folder_that_does_not_exist_is_an_error_and_makes_no_folder() {
    let dir = scratch("no-folder");
    let missing = dir.join("typo/deeper");
    let out_file = missing.join("x.pickle");
    for args in [vec!["demo", "--out", s(&out_file)], vec!["run", "seed-basics", "--snapshot", s(&out_file)]] {
        let out = tensormem(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&format!("no folder {}", missing.display())), "{args:?}: {}", stderr(&out));
        assert!(!dir.join("typo").exists(), "{args:?} made a folder");
    }
    std::fs::remove_dir_all(&dir).ok();
}
