//! Malformed input gives a clear error and never a panic: explicit cases, then byte mutations of
//! real pickles and value mutations of valid JSON, each loaded and (when it loads) replayed.

use proptest::prelude::*;
use tensormem::alloc::AllocatorConfig;
use tensormem::replay::{ReplayOptions, replay_snapshot};
use tensormem::trace;

fn load_err(data: &[u8]) -> String {
    trace::load(data).unwrap_err().to_string()
}

/// Loads, replays what loads (writing the replayed trace, as `replay --snapshot` does) and
/// writes both back: nothing may panic, and whatever is written must load again.
fn exercise(data: &[u8]) {
    if let Ok(snap) = trace::load(data) {
        let capacity = ReplayOptions { capacity: Some(1 << 30), keep_snapshot: true, ..Default::default() };
        for options in [ReplayOptions::default(), capacity] {
            for replayed in replay_snapshot(&snap, &options, &mut |_, _| {}).into_iter().flatten().filter_map(|r| r.snapshot) {
                trace::load(&trace::to_pickle(&replayed)).expect("a replayed snapshot loads again");
            }
        }
        trace::load(&trace::to_pickle(&snap)).expect("a loaded snapshot written as a pickle loads again");
        trace::load(trace::to_json(&snap).as_bytes()).expect("a loaded snapshot written as JSON loads again");
    }
}

#[test]
fn explicit_malformed_inputs() {
    assert_eq!(load_err(b""), "not a snapshot: the file is empty");
    assert!(load_err(b"hello").contains("looks like text (first byte 0x68)"));
    // Truncated pickle.
    assert!(load_err(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments").contains("truncated"));
    // Protocol garbage.
    assert!(load_err(b"\x80\x09.").contains("unsupported pickle protocol 9"));
    assert!(load_err(b"\x80\x04\xff.").contains("unknown opcode 0xff"));
    // A pickle that would call os.system.
    let evil = b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x02id\x94\x85\x94R\x94.";
    let err = load_err(evil);
    assert!(err.contains("STACK_GLOBAL") && err.contains("refused"), "{err}");
    // Wrong types and impossible values, named by their path.
    assert_eq!(load_err(br#"{"segments": 5}"#), "segments: expected a list, found an integer");
    assert_eq!(
        load_err(br#"{"segments": [{"address": 0, "total_size": "big", "blocks": []}]}"#),
        "segments[0].total_size: expected an integer, found a string"
    );
    assert_eq!(
        load_err(br#"{"segments": [{"address": -4096, "total_size": 512, "blocks": []}]}"#),
        "segments[0].address: expected a non-negative 64-bit integer, found -4096"
    );
    assert_eq!(load_err(br#"{"segments": [{"address": 0, "total_size": 1e30, "blocks": []}]}"#), "segments[0].total_size: expected an integer, found a float");
    assert_eq!(
        load_err(br#"{"segments": [], "device_traces": [[{"action": "teleport", "addr": 0, "size": 1}]]}"#),
        "device_traces[0][0].action: unknown action \"teleport\""
    );
    assert_eq!(
        load_err(br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 1, "category": "weights"}]]}"#),
        "device_traces[0][0].category: unknown category \"weights\""
    );
    assert!(load_err(br#"{"segments": []"#).starts_with("bad JSON"));
    // Absurd nesting: serde_json stops at its recursion limit; the pickle reader never recurses.
    let deep = "[".repeat(100_000);
    assert!(load_err(deep.as_bytes()).contains("recursion limit"));
    let mut deep_pickle = b"\x80\x04".to_vec();
    deep_pickle.extend(std::iter::repeat_n(b']', 200_000));
    deep_pickle.extend(std::iter::repeat_n(b'a', 199_999));
    deep_pickle.push(b'.');
    assert_eq!(load_err(&deep_pickle), "segments[0]: expected a dict, found a list");
    // Declared lengths larger than the file allocate nothing.
    assert!(load_err(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f").contains("remain"));
}

/// Values no PyTorch run can produce are refused where they are read, before anything is sized
/// or summed by them (a device index of 2^31 - 1 once sized a 51 GB vector and aborted).
#[test]
fn values_beyond_what_pytorch_can_record_are_refused() {
    let segment = |device: &str| {
        format!(r#"{{"segments": [{{"device": {device}, "address": 0, "total_size": 512, "blocks": [{{"size": 512, "state": "inactive"}}]}}]}}"#)
    };
    assert_eq!(
        load_err(segment("2147483647").as_bytes()),
        "segments[0].device: device 2147483647 cannot be real: PyTorch's device indices are 0 to 127 (an int8)"
    );
    assert_eq!(load_err(segment("-1").as_bytes()), "segments[0].device: device -1 cannot be real: PyTorch's device indices are 0 to 127 (an int8)");
    assert!(trace::load(segment("127").as_bytes()).is_ok());
    let alloc = |size: &str| format!(r#"{{"segments": [], "device_traces": [[{{"action": "alloc", "addr": 4096, "size": {size}, "stream": 0}}]]}}"#);
    assert_eq!(
        load_err(alloc("18446744073709551615").as_bytes()),
        "device_traces[0][0].size: 18446744073709551615 bytes cannot be real: PyTorch refuses to allocate 1 EB (2^60 bytes) or more"
    );
    assert!(trace::load(alloc("1152921504606846975").as_bytes()).is_ok(), "just under 1 EB is a size PyTorch could record");
    // A failed request is recorded whatever its size (raw_alloc skips the 1 EB check).
    assert!(trace::load(br#"{"segments": [], "device_traces": [[{"action": "oom", "size": 18446744073709551615, "device_free": 0}]]}"#).is_ok());
    // Sizes that only add up past 2^64 (seventeen blocks just under 1 EB) are summed without wrapping.
    let blocks = vec![r#"{"size": 1152921504606846464, "state": "active_allocated"}"#; 17].join(",");
    let huge = format!(r#"{{"segments": [{{"address": 0, "total_size": 1152921504606846464, "blocks": [{blocks}]}}]}}"#);
    assert_eq!(trace::load(huge.as_bytes()).unwrap().segments[0].allocated_size, u64::MAX);
    assert_eq!(
        load_err(br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 144115188075855872, "size": 512}]]}"#),
        "device_traces[0][0].addr: address 0x200000000000000 cannot be real: no device maps addresses beyond 57 bits"
    );
    assert_eq!(
        load_err(br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "stream": 18446744073709551615}]]}"#),
        "device_traces[0][0].stream: integer 18446744073709551615 does not fit this field (a signed 64-bit integer)"
    );
    let many = format!(r#"{{"segments": [], "device_traces": [{}]}}"#, vec!["[]"; 129].join(","));
    assert_eq!(load_err(many.as_bytes()), "device_traces: 129 device traces cannot be real: PyTorch addresses at most 128 devices");
}

/// Settings PyTorch would refuse at start-up cannot come from a PyTorch run.
#[test]
fn settings_pytorch_would_refuse_are_refused_by_replay() {
    let with_settings = |settings: &str| {
        let text = format!(r#"{{"segments": [], "device_traces": [[{{"action": "alloc", "addr": 0, "size": 512}}]], "allocator_settings": {settings}}}"#);
        let snap = trace::load(text.as_bytes()).unwrap();
        replay_snapshot(&snap, &ReplayOptions::default(), &mut |_, _| {}).map(|_| ()).map_err(|e| e.to_string())
    };
    assert_eq!(
        with_settings(r#"{"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:-5"}"#).unwrap_err(),
        "the snapshot's allocator_settings are unusable: invalid allocator config \"max_split_size_mb:-5\": max_split_size_mb expects a number, got \"-5\""
    );
    assert!(with_settings(r#"{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"}"#).unwrap_err().contains("Expected a single True/False argument"));
    assert!(with_settings(r#"{"expandable_segments": "maybe"}"#).unwrap_err().contains("is not True or False"));
    assert!(with_settings(r#"{"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:NaN"}"#).unwrap_err().contains("too small"));
    assert!(with_settings(r#"{"garbage_collection_threshold": 2.5}"#).unwrap_err().contains("not a number in [0, 1)"));
    with_settings(r#"{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": true}"#).unwrap();
}

#[test]
fn impossible_layouts_are_refused_by_replay() {
    let overlapping = br#"{"segments": [
        {"address": 0, "total_size": 2097152, "stream": 0, "segment_type": "small", "blocks": [{"size": 2097152, "state": "inactive"}]},
        {"address": 1048576, "total_size": 2097152, "stream": 0, "segment_type": "small", "blocks": [{"size": 2097152, "state": "inactive"}]}
    ], "device_traces": [[]]}"#;
    let snap = trace::load(overlapping).unwrap();
    let err = replay_snapshot(&snap, &ReplayOptions::default(), &mut |_, _| {}).unwrap_err();
    assert_eq!(err.to_string(), "the snapshot cannot be replayed: device 0: segments at 0x0 and 0x100000 overlap");
    let gap = br#"{"segments": [{"address": 0, "total_size": 4096, "blocks": [{"size": 512, "state": "inactive"}]}]}"#;
    let err = replay_snapshot(&trace::load(gap).unwrap(), &ReplayOptions::default(), &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("blocks cover 512 bytes of 4096"), "{err}");
}

/// Real PyTorch snapshots the repository carries (a Triton program's, and one recorded for the
/// doctor's corpus), small enough to cut and mutate often: these tests run wherever the code is.
const REAL_PICKLES: [&str; 2] = ["tests/data/real/triton-unfold-memory.pickle", "tests/data/corpus/dump-before-backward.pickle"];

fn real_pickle(name: &str) -> Vec<u8> {
    std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name)).unwrap()
}

#[test]
fn every_truncation_of_a_real_pickle_is_an_error() {
    // The smaller one: every cut parses up to the cut, so the work grows with the square.
    for name in &REAL_PICKLES[1..] {
        let data = real_pickle(name);
        assert!(trace::load(&data).is_ok(), "{name} loads whole");
        for cut in 0..data.len() {
            assert!(trace::load(&data[..cut]).is_err(), "{name} cut at {cut} of {} bytes loaded", data.len());
        }
    }
}

/// A valid JSON snapshot with a trace, made by our allocator (small enough to mutate often).
fn small_json_snapshot() -> String {
    let snap = tensormem::scenarios::variable_batch_inference(AllocatorConfig::default(), None).unwrap();
    let mut snap = snap;
    snap.device_traces[0].truncate(120);
    trace::to_json(&snap)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn byte_mutations_of_real_pickles_never_panic(
        which in 0usize..2,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..12),
    ) {
        let mut data = real_pickle(REAL_PICKLES[which]);
        for (at, byte, kind) in edits {
            let i = at.index(data.len().max(1));
            match kind {
                0 if !data.is_empty() => data[i] = byte,
                1 if !data.is_empty() => data[i] ^= 1 << (byte % 8),
                2 => data.insert(i.min(data.len()), byte),
                _ => data.truncate(i),
            }
        }
        exercise(&data);
    }

    #[test]
    fn value_mutations_of_valid_json_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop_oneof![
            Just("-1".to_string()), Just("0".to_string()), Just("18446744073709551615".to_string()),
            Just("9223372036854775807".to_string()), Just("512".to_string()), Just("1.5".to_string()),
            Just("\"x\"".to_string()), Just("null".to_string()), Just("[]".to_string()),
            (0u64..1 << 40).prop_map(|v| v.to_string()),
        ]), 1..6),
    ) {
        let json = small_json_snapshot();
        // Replace whole numbers in the text: sizes, addresses, streams, lines.
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let bytes = json.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i].is_ascii_digit() && i > 0 && (bytes[i - 1] == b':' || bytes[i - 1] == b'[' || bytes[i - 1] == b',') {
                let start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                spans.push((start, i));
            } else {
                i += 1;
            }
        }
        let mut chosen: Vec<((usize, usize), String)> = edits.into_iter().map(|(at, v)| (spans[at.index(spans.len())], v)).collect();
        chosen.sort_by_key(|c| std::cmp::Reverse(c.0.0));
        chosen.dedup_by_key(|c| c.0);
        let mut text = json.clone();
        for ((a, b), v) in chosen {
            text.replace_range(a..b, &v);
        }
        exercise(text.as_bytes());
    }
}

/// Found by `cargo fuzz`: a mutated trace made replay hint a segment address that its (diverged)
/// state still used; two segments overlapped and the pool broke. Now the hint is refused.
#[test]
fn fuzz_regression_overlapping_segment_hint() {
    let data = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fuzz-overlapping-segment-hint.json")).unwrap();
    let snap = trace::load(&data).unwrap();
    let results = replay_snapshot(&snap, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
    assert!(results[0].first_divergence.is_some());
}
