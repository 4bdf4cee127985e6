//! Decoded snapshots kept for the next open (issue 51): what is read back is what was decoded,
//! and a cache file that is not whole and current is never used.

mod common;

use std::path::Path;
use tensormem::replay::{self, KnownStart, ReplayOptions};
use tensormem::trace::cache::{self, CacheMiss, Decoded, Folder, KeptStart, SourceKey};
use tensormem::trace::{self, Snapshot};

/// Each device's start state, as the replay reconstructs it, to keep.
fn starts_of(snapshot: &Snapshot) -> Vec<KeptStart> {
    snapshot.devices().into_iter().filter_map(|d| KnownStart::of(snapshot, d).ok()).map(|k| k.to_kept()).collect()
}

fn round_trip(name: &str, bytes: &[u8], snapshot: &Snapshot) {
    let key = SourceKey::of(bytes);
    let starts = starts_of(snapshot);
    let encoded = cache::encode_to_vec(snapshot, &starts, &key);
    let Decoded { snapshot: decoded, starts: kept } = cache::decode_with_starts(&encoded, &key).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(decoded == *snapshot, "{name}: the cached decode differs from the decode");
    assert!(kept == starts, "{name}: the start states kept differ from those reconstructed");
    // Frame lists are shared as they were: the pickle writer memoizes them the same way.
    assert!(trace::to_pickle(&decoded) == trace::to_pickle(snapshot), "{name}: written back, the cached decode differs");
}

#[test]
fn every_real_snapshot_reads_back_equal() {
    let files = common::real_snapshot_files();
    assert!(files.len() > 40, "{} files", files.len());
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let snapshot = trace::load(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        round_trip(&path.display().to_string(), &bytes, &snapshot);
    }
}

#[test]
fn the_keys_only_tensormem_and_newer_pytorch_write_read_back_equal() {
    // Categories and the recording clock (tensormem's own keys), user metadata and an oom's
    // device_free (newer PyTorch's), from a JSON text.
    let run = common::run_scenario("oom", &[]);
    let snapshot = run.snapshot;
    assert!(snapshot.device_traces[0].iter().any(|e| e.category.is_some()) && snapshot.tensormem.is_some());
    let json = trace::to_json(&snapshot);
    round_trip("oom", json.as_bytes(), &snapshot);
    let text = r#"{"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 512, "stream": -3, "time_us": 1700000000000000, "user_metadata": "step 1", "compile_context": "N/A"},
        {"action": "oom", "addr": 0, "size": 1024, "stream": 0, "time_us": 1600000000000000, "device_free": 77, "compile_context": "N/A"}]],
        "allocator_settings": {"expandable_segments": true, "garbage_collection_threshold": 0.8},
        "external_annotations": [{"name": "step", "stage": "START", "device": 0, "time_us": 5}]}"#;
    let snapshot = trace::load(text.as_bytes()).unwrap();
    assert_eq!(snapshot.device_traces[0].at(1).device_free(), Some(77));
    round_trip("json text", text.as_bytes(), &snapshot);
}

fn sample() -> (Vec<u8>, Snapshot) {
    let path =
        common::fixture("gpt-ctx128-forward.pickle").unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real/bf16-forward.pickle"));
    let bytes = std::fs::read(path).unwrap();
    let snapshot = trace::load(&bytes).unwrap();
    (bytes, snapshot)
}

#[test]
fn a_cache_file_cut_short_damaged_or_of_another_source_is_a_miss() {
    let (bytes, snapshot) = sample();
    let key = SourceKey::of(&bytes);
    let encoded = cache::encode_to_vec(&snapshot, &[], &key);
    // Another file (one byte more) and another version.
    let other = SourceKey { len: key.len + 1, ..key };
    assert_eq!(SourceKey::from_file_name(&key.file_name()), Some(key));
    assert_eq!(SourceKey::from_file_name(&other.file_name()[1..]), None);
    assert_eq!(cache::decode(&encoded, &other), Err(CacheMiss::OtherSource));
    let mut old = encoded.clone();
    old[8] ^= 1;
    assert_eq!(cache::decode(&old, &key), Err(CacheMiss::Version));
    // Cut anywhere: never read (a writer killed midway leaves such a file).
    // `ends_agree` (what the page checks before it draws a file from the layout kept with it,
    // reading only the ends) refuses another source, another version and any file cut short.
    let ends = |bytes: &[u8], key: &SourceKey| {
        let (head, tail) = (&bytes[..cache::HEADER.min(bytes.len())], &bytes[bytes.len().saturating_sub(cache::TRAILER)..]);
        cache::ends_agree(head, tail, bytes.len() as u64, key)
    };
    assert!(ends(&encoded, &key) && !ends(&encoded, &other) && !ends(&old, &key));
    for cut in [0, 7, 40, encoded.len() / 3, encoded.len() / 2, encoded.len() - 25, encoded.len() - 1] {
        assert!(cache::decode(&encoded[..cut], &key).is_err(), "cut at {cut} of {}", encoded.len());
        assert!(!ends(&encoded[..cut], &key), "cut at {cut} of {}", encoded.len());
    }
    let mut longer = encoded.clone();
    longer.push(0);
    assert!(!ends(&longer, &key));
    // One bit flipped anywhere in the payload: the checksum says so (the ends still agree: a
    // page that drew the file from its layout kept parses it after).
    for at in (36..encoded.len() - 24).step_by(encoded.len() / 97) {
        let mut damaged = encoded.clone();
        damaged[at] ^= 0x10;
        assert_eq!(cache::decode(&damaged, &key), Err(CacheMiss::Damaged), "byte {at}");
        assert!(ends(&damaged, &key));
    }
}

#[test]
fn the_payload_reader_refuses_what_it_cannot_hold_without_panicking() {
    // A payload that passes the checksum but was not written by the encoder (a count larger
    // than the bytes left, an index past its table): a miss, not a panic or a huge allocation.
    let key = SourceKey::of(b"x");
    let forge = |payload: &[u8]| {
        let mut bytes = cache::encode_to_vec(&Snapshot::default(), &[], &key);
        let header = bytes[..36].to_vec();
        bytes.clear();
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(payload);
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(payload).to_le_bytes());
        bytes.extend_from_slice(b"TMDECEND");
        cache::decode(&bytes, &key)
    };
    assert_eq!(forge(&[0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(), Snapshot::default());
    // A start state with a segment naming frame list 3 of none.
    assert!(matches!(forge(&[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0]), Err(CacheMiss::Malformed(_))));
    // 2^63 strings.
    assert!(matches!(forge(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), Err(CacheMiss::Malformed(_))));
    // A frame list naming string 5 of none.
    assert!(matches!(forge(&[0, 1, 1, 5, 0, 0, 0, 0, 0, 0, 0]), Err(CacheMiss::Malformed(_))));
    // A trace entry with action 12, and one after the end of the payload.
    assert!(matches!(forge(&[0, 0, 0, 0, 1, 1, 12, 0, 0, 0, 0, 0, 0]), Err(CacheMiss::Malformed(_))));
    assert!(matches!(forge(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 9]), Err(CacheMiss::Malformed(_))));
}

#[test]
fn a_folder_keeps_the_most_recently_used_within_its_bound() {
    let dir = std::env::temp_dir().join(format!("tensormem-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (bytes, snapshot) = sample();
    let size = cache::encode_to_vec(&snapshot, &[], &SourceKey::of(&bytes)).len() as u64;
    // Room for two.
    let folder = Folder { dir: dir.join("made/on/first/use"), limit: 2 * size + size / 2 };
    let keys: Vec<SourceKey> = (0..3u8).map(|i| SourceKey::of(&[&bytes[..], &[i]].concat())).collect();
    assert!(folder.get(&keys[0]).is_none());
    folder.put(&keys[0], &snapshot, &[]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    folder.put(&keys[1], &snapshot, &[]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Reading the first makes it the most recent: the second goes when the third arrives.
    assert!(folder.get(&keys[0]).unwrap().snapshot == snapshot);
    std::thread::sleep(std::time::Duration::from_millis(20));
    folder.put(&keys[2], &snapshot, &[]).unwrap();
    let kept = |k: &SourceKey| folder.dir.join(k.file_name()).is_file();
    assert_eq!(keys.iter().map(kept).collect::<Vec<_>>(), [true, false, true]);
    // No temporary file is left, and only cache files were counted or removed.
    let names: Vec<String> = std::fs::read_dir(&folder.dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // A damaged file is a miss, and is removed so that the next decode writes it again.
    let path = folder.dir.join(keys[2].file_name());
    let whole = std::fs::read(&path).unwrap();
    std::fs::write(&path, &whole[..whole.len() - 1]).unwrap();
    assert!(folder.get(&keys[2]).is_none());
    assert!(!path.exists());
    // One decode larger than the bound is not kept at all.
    let tiny = Folder { dir: dir.join("tiny"), limit: size / 2 };
    tiny.put(&keys[0], &snapshot, &[]).unwrap();
    assert!(tiny.get(&keys[0]).is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_start_kept_beside_the_decode_replays_as_one_reconstructed_and_only_its_own_is_used() {
    let (bytes, snapshot) = sample();
    let key = SourceKey::of(&bytes);
    let starts = starts_of(&snapshot);
    assert!(!starts.is_empty() && starts.iter().any(|s| !s.segments.is_empty()), "the sample starts with memory reserved");
    let Decoded { snapshot: read_back, starts: kept } = cache::decode_with_starts(&cache::encode_to_vec(&snapshot, &starts, &key), &key).unwrap();
    let known = KnownStart::all_kept(&read_back, kept.clone());
    assert_eq!(known.len(), starts.len());
    for k in &known {
        let d = k.device();
        assert!(k.of_trace(&read_back, d).is_some(), "the kept start is the read-back trace's");
        let fresh = replay::replay_device(&snapshot, d, &ReplayOptions::default(), &mut |_, _| {}).unwrap();
        let from_kept = replay::replay_device(&read_back, d, &ReplayOptions { known_start: Some(k.clone()), ..Default::default() }, &mut |_, _| {}).unwrap();
        assert_eq!(serde_json::to_value(&from_kept).unwrap(), serde_json::to_value(&fresh).unwrap(), "device {d}");
        // Another snapshot in memory (a copy) reconstructs its own.
        assert!(k.of_trace(&snapshot, d).is_none());
    }
    // A start made by other rules, or for a device the snapshot lacks, is not used.
    let mut other_rules = kept[0].clone();
    other_rules.rules ^= 1;
    assert!(KnownStart::from_kept(&read_back, other_rules).is_none());
    let mut other_device = kept[0].clone();
    other_device.device = 99;
    assert!(KnownStart::from_kept(&read_back, other_device).is_none());
}
