//! The doctor's labelled corpus (issue 31): real PyTorch recordings of ordinary programs in
//! tests/data/corpus, each with the kinds it must and must not show. This file keeps the corpus
//! sound (every file labelled and loadable with the stacks it claims, every label a known kind);
//! the doctor is judged on it as issue 31 lands.

use serde_json::Value;
use std::path::Path;
use tensormem::{doctor, trace};

fn corpus() -> (std::path::PathBuf, Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus");
    let labels: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("labels.json")).unwrap()).unwrap();
    (dir, labels)
}

#[test]
fn every_recording_is_labelled_with_known_kinds_and_loads_with_its_stacks() {
    let (dir, labels) = corpus();
    let files = labels["files"].as_object().unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".pickle").map(str::to_string))
        .collect();
    on_disk.sort();
    let mut labelled: Vec<String> = files.keys().cloned().collect();
    labelled.sort();
    assert_eq!(on_disk, labelled, "every recording has a label and every label a recording");
    for (name, label) in files {
        for key in ["expect", "absent", "inconclusive"] {
            for kind in label[key].as_array().unwrap() {
                assert!(doctor::KINDS.contains(&kind.as_str().unwrap()), "{name}: {key} names an unknown kind {kind}");
            }
        }
        let snapshot = trace::load_file(&dir.join(format!("{name}.pickle"))).unwrap();
        let entries = snapshot.trace_of(0);
        assert!(entries.iter().filter(|e| e.action == trace::Action::Alloc).count() >= 10, "{name}: a program's allocations");
        let frames = || entries.iter().flat_map(|e| e.frames.iter().flat_map(|f| f.iter()));
        assert!(frames().any(|f| f.filename.ends_with(".py")), "{name}: Python frames");
        let cpp = frames().any(|f| !f.filename.ends_with(".py") && !f.filename.is_empty());
        assert_eq!(cpp, name.ends_with("all-stacks"), "{name}: C++ frames only where recorded with stacks='all'");
    }
}
