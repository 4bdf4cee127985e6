//! Snapshots read as a stream: a file fed in chunks of any size loads to exactly what the whole
//! file loads to, trace entries decoded during the parse keep their errors' paths, and a pickle
//! that reads a decoded entry a second time gets a clear error.

mod common;

use proptest::prelude::*;
use tensormem::trace::{self, Loader, Snapshot};

fn load_in_chunks(data: &[u8], sizes: &[usize]) -> Result<Snapshot, String> {
    let mut loader = Loader::new(Some(data.len()));
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at >= data.len() {
            break;
        }
        let end = (at + n.max(1)).min(data.len());
        loader.feed(&data[at..end]).map_err(|e| e.to_string())?;
        assert_eq!(loader.position(), end);
        at = end;
    }
    loader.finish().map_err(|e| e.to_string())
}

#[test]
fn every_fixture_loads_the_same_in_chunks() {
    let Some(dir) = common::fixtures_dir() else { return };
    for name in common::FIXTURES {
        let data = std::fs::read(dir.join(name)).unwrap();
        let whole = trace::load(&data).unwrap();
        for sizes in [&[7usize][..], &[4096], &[1 << 20], &[1, 2, 3, 100_000, 5]] {
            let streamed = load_in_chunks(&data, sizes).unwrap();
            assert!(streamed == whole, "{name} fed in chunks of {sizes:?} differs from the whole file");
        }
    }
}

#[test]
fn truncations_fed_in_chunks_are_the_same_errors() {
    let Some(path) = common::fixture("tiny-settings.pickle") else { return };
    let data = std::fs::read(path).unwrap();
    for cut in (0..data.len()).step_by(97) {
        let whole = trace::load(&data[..cut]).unwrap_err().to_string();
        assert_eq!(load_in_chunks(&data[..cut], &[13]).unwrap_err(), whole, "cut at {cut}");
    }
}

/// A tiny protocol-2 pickle writer for hand-made snapshots.
#[derive(Default)]
struct Pickle(Vec<u8>);

impl Pickle {
    fn new() -> Pickle {
        Pickle(b"\x80\x02".to_vec())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend((s.len() as u32).to_le_bytes());
        self.0.extend(s.as_bytes());
        self
    }
    fn int(&mut self, v: i32) -> &mut Self {
        self.0.push(b'J');
        self.0.extend(v.to_le_bytes());
        self
    }
    fn op(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend(bytes);
        self
    }
    /// `{'action': action, 'addr': addr, 'size': size, 'stream': 0}`, memoized as `memo`.
    fn entry(&mut self, action: &str, addr: Option<i32>, size: i32, memo: u8) -> &mut Self {
        self.op(b"}q").op(&[memo]).op(b"(").str("action").str(action);
        match addr {
            Some(a) => self.str("addr").int(a),
            None => self.str("addr").str("not a number"),
        };
        self.str("size").int(size).str("stream").int(0).op(b"u")
    }
    fn done(&mut self) -> Vec<u8> {
        self.0.push(b'.');
        std::mem::take(&mut self.0)
    }
}

/// `{'segments': [], 'device_traces': [[...entries...]]}` with `entries` writing the entries.
fn snapshot_pickle(entries: impl Fn(&mut Pickle)) -> Vec<u8> {
    let mut p = Pickle::new();
    p.op(b"}(").str("segments").op(b"]").str("device_traces").op(b"](](");
    entries(&mut p);
    p.op(b"eeu");
    p.done()
}

#[test]
fn entries_decoded_while_parsing_are_the_entries() {
    let data = snapshot_pickle(|p| {
        p.entry("alloc", Some(4096), 512, 10).entry("free_requested", Some(4096), 512, 11).entry("free_completed", Some(4096), 512, 12);
    });
    let snap = trace::load(&data).unwrap();
    let actions: Vec<_> = snap.device_traces[0].iter().map(|e| (e.action.name(), e.addr, e.size)).collect();
    assert_eq!(actions, [("alloc", 4096, 512), ("free_requested", 4096, 512), ("free_completed", 4096, 512)]);
    assert!(load_in_chunks(&data, &[1]).unwrap() == snap);
}

#[test]
fn a_bad_entry_is_named_by_its_path() {
    let data = snapshot_pickle(|p| {
        p.entry("alloc", Some(4096), 512, 10).entry("alloc", None, 512, 11);
    });
    assert_eq!(trace::load(&data).unwrap_err().to_string(), "device_traces[0][1].addr: expected an integer, found a string");
}

#[test]
fn an_entry_read_again_after_it_was_decoded_is_a_clear_error() {
    // The same dict twice in one trace (memo 10 read back with BINGET): Python could write it,
    // PyTorch never does; the first copy was decoded and freed when it was appended.
    let data = snapshot_pickle(|p| {
        p.entry("alloc", Some(4096), 512, 10).op(b"e(h\x0a");
    });
    let err = trace::load(&data).unwrap_err().to_string();
    assert!(err.contains("memo entry 10 (a trace entry) is referenced a second time"), "{err}");
    // Read again before it is appended, it is shared: never freed, and it loads twice.
    let data = snapshot_pickle(|p| {
        p.entry("alloc", Some(4096), 512, 10).op(b"h\x0a");
    });
    assert_eq!(trace::load(&data).map(|s| s.device_traces[0].len()).map_err(|e| e.to_string()), Ok(2));
}

/// An entry with a frame list memoized as `list`, holding one frame dict (memoized as `frame`
/// when given), then read again by a later entry with BINGET: PyTorch memoizes every entry's
/// list, and a block's history can name the same one. The parser frees such a list once its
/// entry is decoded (11.5 M of them were most of a 1 GB file's memory) and rebuilds it when read again.
#[test]
fn a_frame_list_freed_with_its_entry_is_rebuilt_when_read_again() {
    for frame in [Some(21u8), None] {
        let data = snapshot_pickle(|p| {
            p.op(b"}q\x0a(").str("action").str("alloc").str("addr").int(4096).str("size").int(512).str("stream").int(0);
            p.str("frames").op(b"]q\x14(}");
            if let Some(memo) = frame {
                p.op(b"q").op(&[memo]);
            }
            p.op(b"(").str("filename").str("train.py").str("line").int(7).str("name").str("step").op(b"ueu");
            // The first batch of entries is appended (and decoded) here; the second reads the list again.
            p.op(b"e(}q\x0b(").str("action").str("free_requested").str("addr").int(4096).str("size").int(512).str("stream").int(0);
            p.str("frames").op(b"h\x14u");
        });
        let snap = trace::load(&data).unwrap_or_else(|e| panic!("frame dict memoized: {frame:?}: {e}"));
        let frames: Vec<_> = snap.device_traces[0].iter().map(|e| e.frames.clone().unwrap()).collect();
        assert_eq!(frames.len(), 2);
        assert_eq!((frames[0][0].filename.as_str(), frames[0][0].line, frames[0][0].name.as_str()), ("train.py", 7, "step"));
        assert_eq!(frames[0], frames[1], "frame dict memoized: {frame:?}");
        assert!(load_in_chunks(&data, &[3]).unwrap() == snap);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_chunking_of_a_real_pickle_loads_the_same(sizes in prop::collection::vec(1usize..5000, 1..20)) {
        let Some(path) = common::fixture("small-state.pickle") else { return Ok(()) };
        let data = std::fs::read(path).unwrap();
        let whole = trace::load(&data).unwrap();
        prop_assert!(load_in_chunks(&data, &sizes).unwrap() == whole);
    }
}

#[test]
fn a_stream_of_unknown_length_still_refuses_absurd_sizes() {
    // LONG_BINPUT 4e9 after a few bytes: a memo that large would be 16 GB.
    let mut loader = Loader::new(None);
    let err = loader.feed(b"\x80\x04]r\x00\x28\x6b\xee.").unwrap_err().to_string();
    assert!(err.contains("memo index 4000000000 is absurd after 8 bytes"), "{err}");
    // A string longer than what can follow is a wait, not an allocation, until the end says so.
    let mut loader = Loader::new(None);
    loader.feed(b"\x80\x04\x8d\xff\xff\xff\xff\xff\x00\x00\x00abc").unwrap();
    assert!(loader.finish().unwrap_err().to_string().contains("remain (truncated file or bad length)"));
}

#[test]
fn a_pickle_cut_between_opcodes_says_the_file_ends_early() {
    let data = snapshot_pickle(|p| {
        p.entry("alloc", Some(4096), 512, 10);
    });
    let cut = &data[..data.len() - 1];
    assert_eq!(trace::load(cut).unwrap_err().to_string(), format!("bad pickle at byte {}: the file ends before the pickle does (truncated?)", cut.len()));
    assert_eq!(load_in_chunks(cut, &[5]).unwrap_err(), trace::load(cut).unwrap_err().to_string());
}

/// Progress while a file loads (issue 51): bytes read, growing to the file's length, and the
/// trace entries decoded so far, reaching the trace's length by the end.
#[test]
fn loading_a_file_tells_how_far_it_has_got() {
    let Some(path) = common::fixture("gpt-medium-ctx128-training.pickle") else { return };
    let mut seen: Vec<trace::LoadProgress> = Vec::new();
    let snap = trace::load_file_with_progress(&path, &mut |p| seen.push(p)).unwrap();
    let length = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(seen.len() > 1, "{} reports for a {length}-byte file", seen.len());
    assert!(seen.windows(2).all(|w| w[0].bytes_read < w[1].bytes_read && w[0].entries_decoded <= w[1].entries_decoded));
    let last = seen.last().unwrap();
    assert_eq!((last.bytes_read, last.total_bytes), (length, Some(length)));
    assert!(last.entries_decoded > 0 && last.entries_decoded <= snap.device_traces.iter().map(|t| t.len()).sum::<usize>());
}

#[test]
fn entries_decoded_from_the_parsers_stack_read_keys_as_a_dict_would() {
    // A repeated key keeps its last value, an unknown key is ignored, a None value is no value,
    // and an integer too wide for a BININT (LONG1, 2^40) is read whole.
    let data = snapshot_pickle(|p| {
        p.op(b"}q\x0a(").str("action").str("alloc").str("addr").int(1).str("size").int(512);
        p.str("addr").op(b"\x8a\x06\x00\x00\x00\x00\x00\x01").str("not_a_key").int(7).str("time_us").op(b"N").op(b"u");
    });
    let snap = trace::load(&data).unwrap();
    let e = &snap.device_traces[0].at(0);
    assert_eq!((e.action.name(), e.addr, e.size, e.time_us), ("alloc", 1 << 40, 512, None));
    assert!(load_in_chunks(&data, &[3]).unwrap() == snap);
}

#[test]
fn an_entry_extended_after_its_items_were_set_is_a_clear_error() {
    // A second SETITEM on a complete trace entry: Python writes one SETITEMS per dict of up to
    // a thousand keys, so this pickle was made by hand; it is refused, not misread.
    let data = snapshot_pickle(|p| {
        p.entry("alloc", Some(4096), 512, 10).str("stream").int(1).op(b"s");
    });
    let err = trace::load(&data).unwrap_err().to_string();
    assert!(err.contains("SETITEM on a trace entry"), "{err}");
}

/// Traces long enough that their entries are kept by a second thread while the parse goes on
/// (past 65,536 entries in a list), beside a short one, on three devices: loaded whole and in
/// odd chunks, they are the entries written, in order, and the progress counts every one.
#[test]
fn long_traces_load_as_written() {
    use std::sync::Arc;
    use tensormem::trace::{Action, Frame, TraceEntry};
    let stacks: Vec<trace::Frames> = (0..5)
        .map(|s| (0..=s).map(|i| Frame { filename: format!("model_{i}.py"), line: 10 + i as u64, name: format!("layer{s}") }).collect::<Vec<_>>().into())
        .collect();
    let trace_of = |n: usize, base: u64| -> Vec<TraceEntry> {
        (0..n)
            .map(|i| {
                let action = [Action::Alloc, Action::FreeRequested, Action::FreeCompleted][i % 3];
                let addr = base + ((i / 3) % 4096) as u64 * 512;
                let frames = (i % 7 != 0).then(|| stacks[i % stacks.len()].clone());
                TraceEntry { action, addr, size: 512 + (i % 11) as u64, stream: 0, time_us: Some(i as i64), frames, category: None, extra: None }
            })
            .collect()
    };
    let written = Snapshot {
        device_traces: vec![trace_of(100_003, 1 << 30).into(), trace_of(10, 2 << 30).into(), trace_of(70_001, 3 << 30).into()],
        ..Snapshot::default()
    };
    let data = trace::to_pickle(&written);
    let whole = trace::load(&data).unwrap();
    assert_eq!(whole.device_traces.iter().map(|t| t.len()).collect::<Vec<_>>(), [100_003, 10, 70_001]);
    assert!(whole == written, "the long traces read back differ from those written");
    assert!(whole.device_traces[0].iter().filter_map(|e| e.frames.as_ref()).all(|f| stacks.iter().any(|s| Arc::ptr_eq(s, f) || **s == **f)));
    let mut loader = Loader::new(Some(data.len()));
    for chunk in data.chunks(333_333) {
        loader.feed(chunk).unwrap();
    }
    assert_eq!(loader.entries_decoded(), 170_014);
    assert!(loader.finish().unwrap() == written);
}
