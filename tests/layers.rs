//! The layers' order (docs/layers.md): each module of `src/` may name only the modules below it.
//! Reads every source file's `crate::` paths (comments left out) and fails on an import that
//! goes up, and on a known one that is gone (take it off the list, so it cannot come back).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom to top. Within the analysis and the engine a module may use the ones before it.
#[rustfmt::skip]
const ORDER: [&str; 23] = [
    // Plain data and files, and work on more than one core.
    "clock", "units", "files", "threads", "dtype", "cards", "trace",
    // PyTorch's caching allocator, and what is read from it.
    "alloc", "report", "replay",
    // The analysis of a trace: no tensors, no GPU (`pytorch`: what PyTorch's frames say).
    "pytorch", "timeline", "doctor", "predict",
    // The engine: kernels, the devices (the only user of wgpu), tensors and their graph, layers.
    "kernels", "device", "tensor", "autograd", "amp", "nn", "bench",
    // Named workloads, then the surfaces.
    "scenarios", "web",
];

/// Upward imports that exist today, each with why it is wrong (none now: keep it so).
const KNOWN_UPWARD: [(&str, &str, &str); 0] = [];

/// The top-level modules a source text names through `crate::` (also inside `crate::{a, b}`).
fn named_modules(text: &str) -> BTreeSet<String> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut names = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect::<String>();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(inside.split(',').map(|item| ident(item.trim())).filter(|n| !n.is_empty()));
        } else {
            names.insert(ident(rest));
        }
    }
    names
}

/// Every (module, module it names above itself) pair, with the files that do it.
fn upward_imports(src: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let mut found: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            let top = relative.split('/').next().unwrap().trim_end_matches(".rs").to_string();
            if top == "lib" {
                continue;
            }
            let Some(own) = rank(&top) else { panic!("src/{relative}: module {top} is not in ORDER: place it in a layer") };
            for name in named_modules(&std::fs::read_to_string(&path).unwrap()) {
                if rank(&name).is_some_and(|r| r > own) {
                    found.entry((top.clone(), name)).or_default().insert(relative.clone());
                }
            }
        }
    }
    found
}

#[test]
fn no_module_imports_one_above_it() {
    let found = upward_imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut wrong = Vec::new();
    for ((from, to), files) in &found {
        if !KNOWN_UPWARD.iter().any(|k| k.0 == from && k.1 == to) {
            wrong.push(format!("{from} imports {to}, which is above it, in {}", files.iter().cloned().collect::<Vec<_>>().join(", ")));
        }
    }
    for (from, to, why) in KNOWN_UPWARD {
        if !found.contains_key(&(from.to_string(), to.to_string())) {
            wrong.push(format!("{from} no longer imports {to} ({why}): take it off KNOWN_UPWARD"));
        }
    }
    assert!(wrong.is_empty(), "the layers' order (docs/layers.md) is broken:\n{}", wrong.join("\n"));
}

#[test]
fn imports_are_read_from_paths_groups_and_not_comments() {
    let text = "use crate::alloc::X;\nuse crate::{trace::Y, device};\n// crate::web in a comment\nlet t = crate::tensor::Tensor::new();";
    let names: Vec<String> = named_modules(text).into_iter().collect();
    assert_eq!(names, ["alloc", "device", "tensor", "trace"]);
}

#[test]
fn an_upward_import_fails_the_test() {
    // A copy of a tiny tree: the allocator naming the web surface, two layers below naming one above.
    let root = std::env::temp_dir().join(format!("tensormem-layers-{}", std::process::id()));
    std::fs::create_dir_all(root.join("alloc")).unwrap();
    std::fs::write(root.join("alloc/mod.rs"), "use crate::trace::Event;\nuse crate::web::Session;\n").unwrap();
    std::fs::write(root.join("trace.rs"), "use crate::units::format_size;\n").unwrap();
    let found = upward_imports(&root);
    std::fs::remove_dir_all(&root).unwrap();
    let pairs: Vec<_> = found.keys().cloned().collect();
    assert_eq!(pairs, [("alloc".to_string(), "web".to_string())]);
    assert_eq!(found[&("alloc".to_string(), "web".to_string())].iter().collect::<Vec<_>>(), ["alloc/mod.rs"]);
}
