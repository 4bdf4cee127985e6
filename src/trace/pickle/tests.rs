use super::*;

#[test]
fn long1_decodes_twos_complement() {
    assert_eq!(long_from_bytes(&[0xff]), Node::Int(-1));
    assert_eq!(long_from_bytes(&[0x00, 0x80, 0x5c, 0x1e, 0x5b, 0x7f]), Node::Int(0x7f5b1e5c8000));
    // 2^64 - 1, as real frames carry for an unknown line
    assert_eq!(long_from_bytes(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]), Node::Int(u64::MAX as i128));
    assert_eq!(long_from_bytes(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), Node::Int(1));
    assert_eq!(long_from_bytes(&[0; 17]), Node::Int(0));
    let mut huge = [0u8; 17];
    huge[16] = 1;
    assert_eq!(long_from_bytes(&huge), Node::BigInt);
}

#[test]
fn long1_of_eight_bytes_or_fewer_is_sign_extended_in_a_register() {
    assert_eq!(le_i64(&[]), 0);
    assert_eq!(le_i64(&[0x80]), -128);
    assert_eq!(le_i64(&[0xff, 0x7f]), 32767);
    assert_eq!(le_i64(&[0, 0, 0, 0, 0, 0, 0, 0x80]), i64::MIN);
    // Every length against the 16-byte sign extension of the general path.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let bytes = seed.to_le_bytes();
        let len = (seed >> 61) as usize + (seed >> 60 & 1) as usize;
        let mut wide = [if len > 0 && bytes[len - 1] & 0x80 != 0 { 0xff } else { 0 }; 16];
        wide[..len].copy_from_slice(&bytes[..len]);
        assert_eq!(le_i64(&bytes[..len]) as i128, i128::from_le_bytes(wide), "{:?}", &bytes[..len]);
    }
}

#[test]
fn refuses_globals() {
    // pickle.dumps(os.system, protocol=2) starts with PROTO 2, GLOBAL 'posix\nsystem\n'
    let data = b"\x80\x02cposix\nsystem\nq\x00.";
    let err = parse(data).unwrap_err();
    assert!(err.message.contains("GLOBAL"), "{err}");
    assert_eq!(err.offset, 2);
}

#[test]
fn declared_length_beyond_file_is_an_error() {
    let data = b"\x80\x04X\xff\xff\xff\x7fabc.";
    let err = parse(data).unwrap_err();
    assert!(err.message.contains("remain"), "{err}");
}

/// A pickle decoded with or without the fast paths for trace entries, fed in chunks; with
/// how many entries `read_entry` read.
fn decode(data: &[u8], fast: bool, chunk: usize) -> (crate::trace::Snapshot, usize) {
    let (snapshot, read_fast) = try_decode(data, fast, chunk);
    (snapshot.unwrap(), read_fast)
}

/// `decode`, with what went wrong as text.
fn try_decode(data: &[u8], fast: bool, chunk: usize) -> (Result<crate::trace::Snapshot, String>, usize) {
    let mut parser = Parser::new(Some(data.len()));
    parser.fast_entries = fast;
    let mut compactor = crate::trace::decode::EntryCompactor::default();
    for piece in data.chunks(chunk) {
        if let Err(e) = parser.feed(piece, &mut compactor) {
            return (Err(e.to_string()), parser.read_fast);
        }
    }
    let read_fast = parser.read_fast;
    let decoded = match parser.finish(&mut compactor) {
        Ok((arena, root)) => crate::trace::decode::snapshot(&arena, root, compactor).map_err(|e| format!("{}: {}", e.path, e.message)),
        Err(e) => Err(e.to_string()),
    };
    (decoded, read_fast)
}

/// Protocol-2 opcodes for the hand-made pickles below: a string (BINUNICODE), with BINPUT `memo`.
fn text(s: &str, memo: Option<u8>) -> Vec<u8> {
    let mut out = vec![b'X'];
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.extend(memo.map(|m| [b'q', m]).into_iter().flatten());
    out
}

/// A snapshot whose one trace holds `entries` (opcodes between the trace list's MARK and
/// APPENDS), with `root` (keys and values) set on the snapshot first.
fn snapshot_pickle(root: &[u8], entries: &[u8]) -> Vec<u8> {
    let mut out = b"\x80\x02}q\x00(".to_vec();
    out.extend_from_slice(root);
    out.extend(text("segments", Some(1)));
    out.extend_from_slice(b"]q\x02");
    out.extend(text("device_traces", Some(3)));
    out.extend_from_slice(b"]q\x04]q\x05(");
    out.extend_from_slice(entries);
    out.extend_from_slice(b"ea");
    out
}

/// An entry the generic opcodes read (its keys are new), memoized at 6, its keys at 7 to 11
/// (`action`, its value `alloc`, `addr`, `size`, and `last`).
fn first_entry(last: &str) -> Vec<u8> {
    let mut out = b"}q\x06(".to_vec();
    for (s, m) in [("action", 7), ("alloc", 8), ("addr", 9)] {
        out.extend(text(s, Some(m)));
    }
    out.extend_from_slice(b"K\x00");
    out.extend(text("size", Some(10)));
    out.extend_from_slice(b"K\x01");
    out.extend(text(last, Some(11)));
    out.extend_from_slice(b"Nu");
    out
}

/// A hostile pickle names an entry dict still waiting to be appended as a frame of the next
/// entry's new frame list, and the snapshot refers to it again: the fast path leaves it
/// shared, as BINGET does, so it is neither freed when appended nor read back as another node.
#[test]
fn an_entry_named_in_the_next_entrys_frame_list_stays_shared() {
    let mut entries = first_entry("frames");
    // The fast path's entry: frames = [the first entry].
    entries.extend_from_slice(b"}(h\x07h\x08h\x09K\x00h\x0aK\x01h\x0b]h\x06au");
    let mut data = snapshot_pickle(b"", &entries);
    data.extend(text("again", None));
    data.extend_from_slice(b"h\x06u.");
    let (generic, _) = try_decode(&data, false, data.len());
    let (fast, read_fast) = try_decode(&data, true, data.len());
    assert_eq!(read_fast, 1);
    assert_eq!(fast, generic);
    assert_eq!(generic.map(|s| s.device_traces[0].len()), Ok(2));
}

/// A pool id that is a list may change between two entries (APPEND to it): the second entry
/// reads the list as it is then, never the first one's pool again. (The fast paths read an
/// entry when its dict is complete, the generic opcodes when it is appended to its trace: a
/// list changed in between, which PyTorch never writes, is read at different times.)
#[test]
fn a_pool_id_list_changed_between_two_entries_is_read_again() {
    let mut root = text("p", None);
    root.extend_from_slice(b"]q\x20(K\x01K\x02e");
    let mut entries = first_entry("pool_id");
    let fast_entry = b"}(h\x07h\x08h\x09K\x00h\x0aK\x01h\x0bh\x20u";
    entries.extend_from_slice(fast_entry);
    entries.extend_from_slice(b"h\x20K\x03a0");
    entries.extend_from_slice(fast_entry);
    let mut data = snapshot_pickle(&root, &entries);
    data.extend_from_slice(b"u.");
    let (generic, _) = try_decode(&data, false, data.len());
    let (fast, read_fast) = try_decode(&data, true, data.len());
    assert_eq!(generic, Err("device_traces[0][1].pool_id: expected a pair".to_string()));
    assert_eq!(read_fast, 1, "the first entry with the pool id, while it is a pair");
    assert_eq!(fast, Err("device_traces[0][2].pool_id: expected a pair".to_string()));
}

/// The real pickles the repository carries decode to the same snapshot through the fast
/// paths for trace entries as through the generic opcodes alone, fed whole and in chunks
/// that cut entries anywhere.
#[test]
fn the_fast_paths_for_trace_entries_decode_what_the_generic_opcodes_do() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/real");
    let (mut read, mut total_fast, mut total) = (0, 0, 0);
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        if path.extension().is_none_or(|e| e != "pickle") {
            continue;
        }
        // The smaller ones (20 of them, from a dozen programs): a debug build is slow.
        if std::fs::metadata(&path).unwrap().len() > 1_500_000 {
            continue;
        }
        let data = std::fs::read(&path).unwrap();
        let (generic, _) = decode(&data, false, data.len().max(1));
        let (fast, read_fast) = decode(&data, true, data.len().max(1));
        assert!(fast == generic, "{}", path.display());
        assert!(decode(&data, true, 997).0 == generic, "{} in chunks", path.display());
        // The fast path reads PyTorch's entries, all but those that meet a frame dict or
        // a key for the first time.
        let entries: usize = generic.device_traces.iter().map(|t| t.len()).sum();
        (total_fast, total) = (total_fast + read_fast, total + entries);
        read += 1;
    }
    assert!(read >= 15, "{read} pickles in {}", dir.display());
    assert!(total_fast * 100 >= total * 95, "{total_fast} of {total} entries read fast");
}

/// A protocol-2 pickle as Python writes it (`pickle.dumps(snapshot, protocol=2)`: BINPUT for
/// every memo entry, all entries appended at the end in one APPENDS, a frame list read again
/// before its entry is appended, an `oom` entry with a 2^62-byte request and `device_free`,
/// a line of 2^64 - 1) reads the same with and without the fast paths, fed whole or byte by byte.
#[test]
fn a_protocol_2_pickle_reads_the_same_with_and_without_the_fast_paths() {
    const DATA: &[u8] = b"\x80\x02\x7d\x71\x00\x28\x58\x08\x00\x00\x00\x73\x65\x67\x6d\x65\x6e\x74\x73\x71\x01\x5d\x71\x02\
\x58\x0d\x00\x00\x00\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x71\x03\x5d\x71\x04\x5d\
\x71\x05\x28\x7d\x71\x06\x28\x58\x06\x00\x00\x00\x61\x63\x74\x69\x6f\x6e\x71\x07\x58\x0d\x00\x00\
\x00\x73\x65\x67\x6d\x65\x6e\x74\x5f\x61\x6c\x6c\x6f\x63\x71\x08\x58\x04\x00\x00\x00\x61\x64\x64\
\x72\x71\x09\x8a\x06\x00\x00\x00\x00\x00\x01\x58\x04\x00\x00\x00\x73\x69\x7a\x65\x71\x0a\x4a\x00\
\x00\x20\x00\x58\x06\x00\x00\x00\x73\x74\x72\x65\x61\x6d\x71\x0b\x4b\x00\x58\x07\x00\x00\x00\x74\
\x69\x6d\x65\x5f\x75\x73\x71\x0c\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x58\x06\x00\x00\x00\x66\x72\
\x61\x6d\x65\x73\x71\x0d\x5d\x71\x0e\x7d\x71\x0f\x28\x58\x08\x00\x00\x00\x66\x69\x6c\x65\x6e\x61\
\x6d\x65\x71\x10\x58\x08\x00\x00\x00\x74\x72\x61\x69\x6e\x2e\x70\x79\x71\x11\x58\x04\x00\x00\x00\
\x6c\x69\x6e\x65\x71\x12\x4b\x0c\x58\x04\x00\x00\x00\x6e\x61\x6d\x65\x71\x13\x58\x04\x00\x00\x00\
\x73\x74\x65\x70\x71\x14\x75\x61\x75\x7d\x71\x15\x28\x68\x07\x58\x05\x00\x00\x00\x61\x6c\x6c\x6f\
\x63\x71\x16\x68\x09\x8a\x06\x00\x00\x00\x00\x00\x01\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\
\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x68\x0d\x5d\x71\x17\x28\x68\x0f\x7d\x71\x18\x28\x68\x10\x58\
\x08\x00\x00\x00\x6d\x6f\x64\x65\x6c\x2e\x70\x79\x71\x19\x68\x12\x8a\x09\xff\xff\xff\xff\xff\xff\
\xff\xff\x00\x68\x13\x58\x07\x00\x00\x00\x66\x6f\x72\x77\x61\x72\x64\x71\x1a\x75\x65\x75\x7d\x71\
\x1b\x28\x68\x07\x68\x16\x68\x09\x8a\x06\x00\x02\x00\x00\x00\x01\x68\x0a\x4d\x00\x04\x68\x0b\x4b\
\x00\x68\x0c\x8a\x07\x00\x42\x1e\x18\x24\x0b\x06\x68\x0d\x5d\x71\x1c\x28\x68\x18\x68\x0f\x65\x75\
\x7d\x71\x1d\x28\x68\x07\x58\x0e\x00\x00\x00\x66\x72\x65\x65\x5f\x72\x65\x71\x75\x65\x73\x74\x65\
\x64\x71\x1e\x68\x09\x8a\x06\x00\x00\x00\x00\x00\x01\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\
\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x68\x0d\x68\x17\x75\x7d\x71\x1f\x28\x68\x07\x58\x0e\x00\x00\
\x00\x66\x72\x65\x65\x5f\x63\x6f\x6d\x70\x6c\x65\x74\x65\x64\x71\x20\x68\x09\x8a\x06\x00\x00\x00\
\x00\x00\x01\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x8a\x07\x00\x40\x1e\x18\x24\x0b\x06\x68\
\x0d\x68\x17\x75\x7d\x71\x21\x28\x68\x07\x58\x03\x00\x00\x00\x6f\x6f\x6d\x71\x22\x68\x09\x4b\x00\
\x68\x0a\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40\x68\x0b\x4b\x00\x68\x0c\x8a\x07\x00\x40\x1e\x18\
\x24\x0a\x06\x68\x0d\x5d\x71\x23\x58\x0b\x00\x00\x00\x64\x65\x76\x69\x63\x65\x5f\x66\x72\x65\x65\
\x71\x24\x4b\x03\x75\x65\x61\x75\x2e";
    let decoded: Vec<_> = [(false, DATA.len()), (true, DATA.len()), (true, 1), (false, 1)].map(|(fast, chunk)| decode(DATA, fast, chunk).0).into();
    assert!(decoded.iter().all(|s| *s == decoded[0]));
    let trace = &decoded[0].device_traces[0];
    let actions: Vec<&str> = trace.iter().map(|e| e.action.name()).collect();
    assert_eq!(actions, ["segment_alloc", "alloc", "alloc", "free_requested", "free_completed", "oom"]);
    assert_eq!((trace.at(2).addr, trace.at(2).size, trace.at(2).time_us), ((1 << 40) + 512, 1024, Some(1_700_000_000_000_000 + (1 << 40) + 512)));
    assert_eq!((trace.at(5).size, trace.at(5).device_free()), (1 << 62, Some(3)));
    let frames = trace.at(1).frames.as_deref().unwrap();
    assert_eq!((frames[1].name.as_str(), frames[1].line), ("forward", u64::MAX));
    assert!(std::sync::Arc::ptr_eq(trace.at(1).frames.as_ref().unwrap(), trace.at(3).frames.as_ref().unwrap()));
}

/// A frame list and a string met in entries the fast path reads are parked at once; later
/// entries the generic opcodes read (a key the fast path does not know, holding a tuple)
/// read them back as nodes, and more entries the fast path reads find those nodes: the
/// same decode as the generic opcodes alone give, one stack and one string shared.
#[test]
fn what_the_fast_path_parked_is_read_back_by_the_generic_opcodes() {
    // pickle.dumps(protocol=4) of seven entries: the first meets its frame dict (generic),
    // the second has a new list of it (fast), the third an odd key (generic), the fourth
    // the second's list again (fast), the fifth a new "N/A" (fast), the sixth that string
    // and an odd key (generic), the seventh that string again (fast).
    const DATA: &[u8] = b"\x80\x04\x95\x7c\x01\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\
\x94\x5d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x28\
\x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\
\x64\x72\x94\x4b\x00\x8c\x04\x73\x69\x7a\x65\x94\x4d\x00\x02\x8c\x06\x73\x74\x72\x65\x61\x6d\x94\
\x4b\x00\x8c\x06\x66\x72\x61\x6d\x65\x73\x94\x5d\x94\x7d\x94\x28\x8c\x08\x66\x69\x6c\x65\x6e\x61\
\x6d\x65\x94\x8c\x04\x61\x2e\x70\x79\x94\x8c\x04\x6c\x69\x6e\x65\x94\x4b\x01\x8c\x04\x6e\x61\x6d\
\x65\x94\x8c\x01\x66\x94\x75\x61\x75\x7d\x94\x28\x68\x07\x68\x08\x68\x09\x4d\x00\x04\x68\x0a\x4d\
\x00\x02\x68\x0b\x4b\x00\x68\x0c\x5d\x94\x68\x0e\x61\x75\x7d\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\
\x65\x5f\x72\x65\x71\x75\x65\x73\x74\x65\x64\x94\x68\x09\x4d\x00\x04\x68\x0a\x4d\x00\x02\x68\x0b\
\x4b\x00\x68\x0c\x68\x15\x8c\x0f\x63\x6f\x6d\x70\x69\x6c\x65\x5f\x63\x6f\x6e\x74\x65\x78\x74\x94\
\x8c\x01\x78\x94\x8c\x03\x6f\x64\x64\x94\x4b\x00\x4b\x01\x86\x94\x75\x7d\x94\x28\x68\x07\x68\x17\
\x68\x09\x4d\x00\x04\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x68\x15\x75\x7d\x94\x28\x68\x07\
\x68\x08\x68\x09\x4d\x00\x08\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x68\x15\x68\x18\x8c\x03\
\x4e\x2f\x41\x94\x75\x7d\x94\x28\x68\x07\x68\x08\x68\x09\x4d\x00\x10\x68\x0a\x4d\x00\x02\x68\x0b\
\x4b\x00\x68\x0c\x68\x15\x68\x18\x68\x1e\x68\x1a\x4b\x00\x4b\x01\x4b\x02\x87\x94\x75\x7d\x94\x28\
\x68\x07\x68\x08\x68\x09\x4d\x00\x20\x68\x0a\x4d\x00\x02\x68\x0b\x4b\x00\x68\x0c\x68\x15\x68\x18\
\x68\x1e\x75\x65\x61\x75\x2e";
    let (generic, _) = decode(DATA, false, DATA.len());
    let (fast, read_fast) = decode(DATA, true, DATA.len());
    assert_eq!(read_fast, 4);
    assert!(fast == generic);
    assert!(decode(DATA, true, 1).0 == generic);
    let trace = &fast.device_traces[0];
    let addrs = [0, 1024, 1024, 1024, 2048, 4096, 8192];
    assert_eq!(trace.iter().map(|e| e.addr).collect::<Vec<_>>(), addrs);
    let frames = |i: usize| trace.at(i).frames.clone().unwrap();
    assert_eq!((frames(1)[0].filename.as_str(), frames(1)[0].line, frames(1)[0].name.as_str()), ("a.py", 1, "f"));
    assert!((2..7).all(|i| std::sync::Arc::ptr_eq(&frames(1), &frames(i))));
    let context = |i: usize| trace.at(i).extra.as_ref().and_then(|x| x.compile_context.clone());
    assert_eq!(context(2).as_deref(), Some("x"));
    assert!((4..7).all(|i| context(i).as_deref() == Some("N/A")));
}

#[test]
fn memo_sharing_is_kept() {
    // [d, d] where d = {} is memoized once: pickle.dumps([d, d], protocol=4)
    let data = b"\x80\x04\x95\x09\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94h\x01e.";
    let (arena, root) = parse(data).unwrap();
    let Node::List(items) = arena.get(root) else { panic!() };
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], items[1]);
}
