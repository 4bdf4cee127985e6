//! Decoded snapshots kept for the next open (issue 51, "open again at once").
//!
//! Decoding a 1 GB pickle takes seconds however fast the parser; reading back what it decoded,
//! in a form made for it, takes a fraction of that. This module writes a decoded [`Snapshot`]
//! in such a form and reads it back equal, frame-list sharing included (so the pickle writer
//! memoizes as it did), keyed by a hash of the source file's bytes: an edited file is a new key,
//! never a stale answer.
//!
//! The form: a header (magic, version, the source's length and xxh3-128 hash), then tables of
//! the strings, frame lists and rarer entry keys, the segments, and the traces with one byte of
//! action and flags per entry and LEB128 varints for its numbers (times as differences), then
//! each device's start state as the replay reconstructed it (see [`KeptStart`]), then a
//! trailer with the payload's length and xxh3-64 hash. A file cut short, damaged or written by
//! another version fails these checks and reads as absent, so a cache can never show the wrong
//! data; the decoder also checks every count and index against what is left, and never panics.
//!
//! Natively [`Folder`] keeps these files in the cache folder (`TENSORMEM_CACHE`); the page keeps
//! the same bytes in IndexedDB.

use super::model::*;
use super::{StackId, Trace};
use rustc_hash::FxHashMap;
use std::io::Write;
use std::sync::Arc;
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

const MAGIC: &[u8; 8] = b"TMDECODE";
const END: &[u8; 8] = b"TMDECEND";
/// Bumped whenever the layout or what decoding produces changes: older files read as absent.
const VERSION: u32 = 3;
/// A kept file's header (magic, version, the source's key) and trailer (the payload's length
/// and hash, the end mark), in bytes: what [`ends_agree`] reads of a kept decode.
pub const HEADER: usize = 8 + 4 + 8 + 16;
pub const TRAILER: usize = 8 + 8 + 8;

/// Which file a cached decode belongs to: its length and the xxh3-128 hash of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceKey {
    pub len: u64,
    pub hash: u128,
}

impl SourceKey {
    pub fn of(bytes: &[u8]) -> SourceKey {
        let mut h = SourceHasher::default();
        h.update(bytes);
        h.finish()
    }

    /// The cache file's name: the hash and the length, in hex.
    pub fn file_name(&self) -> String {
        format!("{:032x}-{:x}.tmdecoded", self.hash, self.len)
    }

    /// The key a [`SourceKey::file_name`] names.
    pub fn from_file_name(name: &str) -> Option<SourceKey> {
        let (hash, len) = name.strip_suffix(".tmdecoded")?.split_once('-')?;
        let key = SourceKey { len: u64::from_str_radix(len, 16).ok()?, hash: u128::from_str_radix(hash, 16).ok()? };
        (key.file_name() == name).then_some(key)
    }
}

/// Hashes a source as it streams in.
#[derive(Default, Clone)]
pub struct SourceHasher {
    hasher: Xxh3,
    len: u64,
}

impl SourceHasher {
    pub fn update(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.len += chunk.len() as u64;
    }

    pub fn bytes_hashed(&self) -> u64 {
        self.len
    }

    pub fn finish(&self) -> SourceKey {
        SourceKey { len: self.len, hash: self.hasher.digest128() }
    }
}

/// A device's start state as the replay reconstructs it (its segments and blocks before the
/// trace's first entry, and what did not add up), kept beside the decode: walking a 1 GB trace
/// backwards again takes a third of a replay. `rules` names the reconstruction that made it (the
/// replay's `START_RULES`): a start made by other rules is not used.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptStart {
    pub device: i64,
    pub rules: u64,
    pub segments: Vec<Segment>,
    pub warnings: Vec<String>,
}

/// What [`decode_with_starts`] reads back.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub snapshot: Snapshot,
    pub starts: Vec<KeptStart>,
}

/// Writes `snapshot`, decoded from the source `key` names, and the start states reconstructed
/// for it, to `out`.
pub fn encode(snapshot: &Snapshot, starts: &[KeptStart], key: &SourceKey, out: &mut dyn Write) -> std::io::Result<()> {
    write_framed(MAGIC, VERSION, key, out, |w| Encoder::new(snapshot, starts).write(snapshot, starts, w))
}

/// Writes a kept file: a header (`magic`, `version`, the source's key), the payload `write`
/// gives, and a trailer with the payload's length and hash. The frame every kept form shares
/// (this decode, a laid-out timeline: `timeline::kept`), read by [`read_framed`].
pub(crate) fn write_framed(
    magic: &[u8; 8],
    version: u32,
    key: &SourceKey,
    out: &mut dyn Write,
    write: impl FnOnce(&mut Writer) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(magic);
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&key.len.to_le_bytes());
    header.extend_from_slice(&key.hash.to_le_bytes());
    out.write_all(&header)?;
    let mut w = Writer { buf: Vec::with_capacity(1 << 20), out, hasher: Xxh3::new(), written: 0 };
    write(&mut w)?;
    w.flush()?;
    let mut trailer = Vec::with_capacity(TRAILER);
    trailer.extend_from_slice(&w.written.to_le_bytes());
    trailer.extend_from_slice(&w.hasher.digest().to_le_bytes());
    trailer.extend_from_slice(END);
    w.out.write_all(&trailer)
}

/// Reads what [`write_framed`] wrote with `magic` and `version` for the source `key`: `read`
/// gets the payload, and must read all of it. Anything else (another source, another version, a
/// truncated or damaged file, a malformed payload) is a [`CacheMiss`].
pub(crate) fn read_framed<T>(
    magic: &[u8; 8],
    version: u32,
    key: &SourceKey,
    bytes: &[u8],
    read: impl FnOnce(&mut Reader) -> Result<T, Malformed>,
) -> Result<T, CacheMiss> {
    let mut r = Reader { bytes: payload(magic, version, key, bytes)?, at: 0 };
    let value = read(&mut r).map_err(|_| CacheMiss::Malformed(r.at))?;
    if r.at != r.bytes.len() {
        return Err(CacheMiss::Malformed(r.at));
    }
    Ok(value)
}

/// The payload of what [`write_framed`] wrote with `magic` and `version` for the source `key`,
/// if whole (its length and hash as written).
fn payload<'b>(magic: &[u8; 8], version: u32, key: &SourceKey, bytes: &'b [u8]) -> Result<&'b [u8], CacheMiss> {
    if bytes.len() < HEADER + TRAILER || &bytes[..8] != magic || bytes[8..12] != version.to_le_bytes() {
        return Err(CacheMiss::Version);
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
    let hash = u128::from_le_bytes(bytes[20..36].try_into().unwrap());
    if (SourceKey { len, hash }) != *key {
        return Err(CacheMiss::OtherSource);
    }
    let (payload, trailer) = bytes[HEADER..].split_at(bytes.len() - HEADER - TRAILER);
    let stored_len = u64::from_le_bytes(trailer[..8].try_into().unwrap());
    let stored_hash = u64::from_le_bytes(trailer[8..16].try_into().unwrap());
    if &trailer[16..] != END || stored_len != payload.len() as u64 || stored_hash != xxh3_64(payload) {
        return Err(CacheMiss::Damaged);
    }
    Ok(payload)
}

/// Whether the ends of a kept decode `len` bytes long (its first [`HEADER`] and last [`TRAILER`]
/// bytes) say it is one [`encode`] wrote for the source `key`, by this version, and as long as
/// written: a file cut short or replaced never agrees. What lies between is checked against its
/// hash when read back. The page checks this much before it draws a file from its layout kept.
pub fn ends_agree(head: &[u8], tail: &[u8], len: u64, key: &SourceKey) -> bool {
    if head.len() != HEADER || tail.len() != TRAILER || len < (HEADER + TRAILER) as u64 {
        return false;
    }
    let stored_key = SourceKey { len: u64::from_le_bytes(head[12..20].try_into().unwrap()), hash: u128::from_le_bytes(head[20..36].try_into().unwrap()) };
    let stored_len = u64::from_le_bytes(tail[..8].try_into().unwrap());
    &head[..8] == MAGIC && head[8..12] == VERSION.to_le_bytes() && stored_key == *key && stored_len == len - (HEADER + TRAILER) as u64 && &tail[16..] == END
}

/// [`encode`] into memory.
pub fn encode_to_vec(snapshot: &Snapshot, starts: &[KeptStart], key: &SourceKey) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode(snapshot, starts, key, &mut bytes).expect("writing to memory cannot fail");
    bytes
}

/// Why cached bytes were not used (each means: decode the source again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheMiss {
    #[error("not a decoded snapshot of this version")]
    Version,
    #[error("decoded from another file")]
    OtherSource,
    #[error("cut short or damaged (length or checksum differs)")]
    Damaged,
    #[error("malformed at payload byte {0}")]
    Malformed(usize),
}

/// The snapshot [`encode`] wrote for the source `key` (see [`decode_with_starts`]).
pub fn decode(bytes: &[u8], key: &SourceKey) -> Result<Snapshot, CacheMiss> {
    decode_with_starts(bytes, key).map(|d| d.snapshot)
}

/// Reads what [`encode`] wrote for the source `key`. Anything else (another source, another
/// version, a truncated or damaged file) is a [`CacheMiss`], never a wrong snapshot.
pub fn decode_with_starts(bytes: &[u8], key: &SourceKey) -> Result<Decoded, CacheMiss> {
    read_framed(MAGIC, VERSION, key, bytes, Decoder::read)
}

/// The payload's bytes, flushed to `out` a megabyte at a time and hashed on the way.
pub(crate) struct Writer<'a> {
    buf: Vec<u8>,
    out: &'a mut dyn Write,
    hasher: Xxh3,
    written: u64,
}

impl Writer<'_> {
    pub(crate) fn byte(&mut self, b: u8) {
        self.buf.push(b);
    }

    pub(crate) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    pub(crate) fn signed(&mut self, v: i64) {
        self.varint(((v << 1) ^ (v >> 63)) as u64);
    }

    /// Bytes as they are (numbers that do not pack as varints: heights, times).
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.varint(s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// An optional value as JSON text (the small, rarely present, open-ended parts).
    pub(crate) fn json<T: serde::Serialize>(&mut self, value: &Option<T>) {
        match value {
            None => self.byte(0),
            Some(v) => {
                self.byte(1);
                self.str(&serde_json::to_string(v).expect("snapshot parts serialize"));
            }
        }
    }

    pub(crate) fn flush_if_full(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= 1 << 20 { self.flush() } else { Ok(()) }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.hasher.update(&self.buf);
        self.written += self.buf.len() as u64;
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }
}

/// Tables of what many entries share, each item once, in first-seen order.
struct Encoder<'s> {
    strings: FxHashMap<&'s str, u32>,
    string_list: Vec<&'s str>,
    /// Frame lists by identity (pointer and length), as the snapshot shares them.
    frames: FxHashMap<(*const Frame, usize), u32>,
    frame_lists: Vec<&'s Frames>,
    extras: FxHashMap<*const EntryExtra, u32>,
    extra_list: Vec<&'s EntryExtra>,
}

impl<'s> Encoder<'s> {
    fn new(snapshot: &'s Snapshot, starts: &'s [KeptStart]) -> Encoder<'s> {
        let mut e = Encoder {
            strings: Default::default(),
            string_list: Vec::new(),
            frames: Default::default(),
            frame_lists: Vec::new(),
            extras: Default::default(),
            extra_list: Vec::new(),
        };
        for s in snapshot.segments.iter().chain(starts.iter().flat_map(|start| &start.segments)) {
            e.intern_frames(&s.frames);
            for b in &s.blocks {
                e.intern_frames(&b.frames);
            }
        }
        // Each trace's tables hold its distinct stacks and rarer keys: no entry is read here.
        for trace in &snapshot.device_traces {
            for f in trace.stacks().iter().flatten() {
                e.intern_frames(f);
            }
            for x in trace.extras().iter().flatten() {
                let id = Arc::as_ptr(x);
                if !e.extras.contains_key(&id) {
                    e.extras.insert(id, e.extra_list.len() as u32);
                    e.extra_list.push(x);
                    for s in [&x.compile_context, &x.user_metadata].into_iter().flatten() {
                        e.intern_str(s);
                    }
                }
            }
        }
        e
    }

    fn intern_str(&mut self, s: &'s str) {
        if !self.strings.contains_key(s) {
            self.strings.insert(s, self.string_list.len() as u32);
            self.string_list.push(s);
        }
    }

    fn intern_frames(&mut self, frames: &'s Frames) {
        let id = (frames.as_ptr(), frames.len());
        if self.frames.contains_key(&id) {
            return;
        }
        self.frames.insert(id, self.frame_lists.len() as u32);
        self.frame_lists.push(frames);
        for f in frames.iter() {
            self.intern_str(&f.filename);
            self.intern_str(&f.name);
        }
    }

    fn frames_id(&self, frames: &Frames) -> u64 {
        self.frames[&(frames.as_ptr(), frames.len())] as u64
    }

    fn write(&self, snapshot: &Snapshot, starts: &[KeptStart], w: &mut Writer) -> std::io::Result<()> {
        w.varint(self.string_list.len() as u64);
        for s in &self.string_list {
            w.str(s);
            w.flush_if_full()?;
        }
        w.varint(self.frame_lists.len() as u64);
        for list in &self.frame_lists {
            w.varint(list.len() as u64);
            for f in list.iter() {
                w.varint(self.strings[f.filename.as_str()] as u64);
                w.varint(f.line);
                w.varint(self.strings[f.name.as_str()] as u64);
            }
            w.flush_if_full()?;
        }
        w.varint(self.extra_list.len() as u64);
        for x in &self.extra_list {
            let flags = x.device_free.is_some() as u8
                | (x.compile_context.is_some() as u8) << 1
                | (x.user_metadata.is_some() as u8) << 2
                | (x.pool_id.is_some() as u8) << 3;
            w.byte(flags);
            if let Some(free) = x.device_free {
                w.varint(free);
            }
            for s in [&x.compile_context, &x.user_metadata].into_iter().flatten() {
                w.varint(self.strings[&**s] as u64);
            }
            if let Some((a, b)) = x.pool_id {
                w.signed(a);
                w.signed(b);
            }
        }
        self.write_segments(&snapshot.segments, w)?;
        w.varint(snapshot.device_traces.len() as u64);
        for trace in &snapshot.device_traces {
            w.varint(trace.len() as u64);
            // The kept list of each stack in the trace's table, by its id.
            let stack_lists: Vec<u64> = trace.stacks().iter().map(|f| f.as_ref().map_or(0, |f| self.frames_id(f))).collect();
            let mut last_time = 0i64;
            for (i, e) in trace.iter().enumerate() {
                let flags = e.action as u8
                    | (e.time_us.is_some() as u8) << 4
                    | (e.frames.is_some() as u8) << 5
                    | (e.category.is_some() as u8) << 6
                    | (e.extra.is_some() as u8) << 7;
                w.byte(flags);
                w.varint(e.addr);
                w.varint(e.size);
                w.signed(e.stream);
                if let Some(t) = e.time_us {
                    w.signed(t.wrapping_sub(last_time));
                    last_time = t;
                }
                if e.frames.is_some() {
                    w.varint(stack_lists[e.stack as usize]);
                }
                if let Some(c) = e.category {
                    w.byte(c as u8);
                }
                if let Some(x) = &e.extra {
                    w.varint(self.extras[&Arc::as_ptr(x)] as u64);
                }
                if i % 4096 == 0 {
                    w.flush_if_full()?;
                }
            }
        }
        w.json(&snapshot.allocator_settings);
        w.json(&snapshot.external_annotations);
        w.json(&snapshot.tensormem);
        w.varint(starts.len() as u64);
        for start in starts {
            w.signed(start.device);
            w.varint(start.rules);
            self.write_segments(&start.segments, w)?;
            w.varint(start.warnings.len() as u64);
            for warning in &start.warnings {
                w.str(warning);
            }
        }
        Ok(())
    }

    fn write_segments(&self, segments: &[Segment], w: &mut Writer) -> std::io::Result<()> {
        w.varint(segments.len() as u64);
        for s in segments {
            w.signed(s.device);
            for v in [s.address, s.total_size, s.allocated_size, s.active_size, s.requested_size] {
                w.varint(v);
            }
            w.signed(s.stream);
            w.byte(s.segment_type as u8);
            w.signed(s.segment_pool_id.0);
            w.signed(s.segment_pool_id.1);
            w.byte(s.is_expandable as u8);
            w.varint(self.frames_id(&s.frames));
            w.varint(s.blocks.len() as u64);
            for b in &s.blocks {
                for v in [b.address, b.size, b.requested_size] {
                    w.varint(v);
                }
                w.byte(b.state as u8);
                w.varint(self.frames_id(&b.frames));
            }
            w.flush_if_full()?;
        }
        Ok(())
    }
}

/// The decoder found the payload malformed (where: [`Reader::at`]).
pub(crate) struct Malformed;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    pub(crate) fn byte(&mut self) -> Result<u8, Malformed> {
        let b = *self.bytes.get(self.at).ok_or(Malformed)?;
        self.at += 1;
        Ok(b)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(Malformed)
    }

    pub(crate) fn signed(&mut self) -> Result<i64, Malformed> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// A count of items, each at least `min_bytes` long: never more than the bytes left hold,
    /// so a damaged count cannot size an allocation.
    pub(crate) fn count(&mut self, min_bytes: usize) -> Result<usize, Malformed> {
        let n = self.varint()?;
        if n > ((self.bytes.len() - self.at) / min_bytes.max(1)) as u64 {
            return Err(Malformed);
        }
        Ok(n as usize)
    }

    pub(crate) fn index<'t, T>(&mut self, table: &'t [T]) -> Result<&'t T, Malformed> {
        let i = self.varint()?;
        table.get(usize::try_from(i).map_err(|_| Malformed)?).ok_or(Malformed)
    }

    /// The next `len` bytes as they are.
    pub(crate) fn raw(&mut self, len: usize) -> Result<&[u8], Malformed> {
        let end = self.at.checked_add(len).filter(|&end| end <= self.bytes.len()).ok_or(Malformed)?;
        let bytes = &self.bytes[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    pub(crate) fn str(&mut self) -> Result<&str, Malformed> {
        let len = self.count(1)?;
        let s = std::str::from_utf8(&self.bytes[self.at..self.at + len]).map_err(|_| Malformed)?;
        self.at += len;
        Ok(s)
    }

    pub(crate) fn json<T: serde::de::DeserializeOwned>(&mut self) -> Result<Option<T>, Malformed> {
        match self.byte()? {
            0 => Ok(None),
            1 => serde_json::from_str(self.str()?).map(Some).map_err(|_| Malformed),
            _ => Err(Malformed),
        }
    }
}

struct Decoder;

impl Decoder {
    fn read(r: &mut Reader) -> Result<Decoded, Malformed> {
        let strings: Vec<Arc<str>> = (0..r.count(1)?).map(|_| r.str().map(Arc::from)).collect::<Result<_, _>>()?;
        let n = r.count(1)?;
        let mut frame_lists: Vec<Frames> = Vec::with_capacity(n);
        for _ in 0..n {
            let n = r.count(3)?;
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                let filename = r.index(&strings)?.to_string();
                let line = r.varint()?;
                let name = r.index(&strings)?.to_string();
                list.push(Frame { filename, line, name });
            }
            frame_lists.push(Arc::from(list));
        }
        let n = r.count(1)?;
        let mut extras: Vec<Arc<EntryExtra>> = Vec::with_capacity(n);
        for _ in 0..n {
            let flags = r.byte()?;
            let device_free = if flags & 1 != 0 { Some(r.varint()?) } else { None };
            let compile_context = if flags & 2 != 0 { Some(r.index(&strings)?.clone()) } else { None };
            let user_metadata = if flags & 4 != 0 { Some(r.index(&strings)?.clone()) } else { None };
            let pool_id = if flags & 8 != 0 { Some((r.signed()?, r.signed()?)) } else { None };
            extras.push(Arc::new(EntryExtra { device_free, compile_context, user_metadata, pool_id }));
        }
        let segments = Self::segments(r, &frame_lists)?;
        let n = r.count(1)?;
        let mut device_traces = Vec::with_capacity(n);
        for _ in 0..n {
            let n = r.count(4)?;
            let mut trace = Trace::new();
            trace.reserve(n);
            // Each kept stack's id in this trace, once it is met: no entry looks it up again.
            let mut stack_ids: Vec<Option<StackId>> = vec![None; frame_lists.len()];
            let mut last_time = 0i64;
            for _ in 0..n {
                let flags = r.byte()?;
                let action = *Action::ALL.get((flags & 15) as usize).ok_or(Malformed)?;
                let addr = r.varint()?;
                let size = r.varint()?;
                let stream = r.signed()?;
                let time_us = if flags & 16 != 0 {
                    last_time = last_time.wrapping_add(r.signed()?);
                    Some(last_time)
                } else {
                    None
                };
                let stack = if flags & 32 != 0 {
                    let k = usize::try_from(r.varint()?).map_err(|_| Malformed)?;
                    match stack_ids.get(k).ok_or(Malformed)? {
                        Some(id) => *id,
                        None => *stack_ids[k].insert(trace.intern_stack(&Some(frame_lists[k].clone()))),
                    }
                } else {
                    0
                };
                let category = if flags & 64 != 0 { Some(*Category::ALL.get(r.byte()? as usize).ok_or(Malformed)?) } else { None };
                let extra = if flags & 128 != 0 { Some(r.index(&extras)?.clone()) } else { None };
                trace.push_with_stack(TraceEntry { action, addr, size, stream, time_us, frames: None, category, extra }, stack);
            }
            device_traces.push(trace);
        }
        let snapshot = Snapshot { segments, device_traces, allocator_settings: r.json()?, external_annotations: r.json()?, tensormem: r.json()? };
        let n = r.count(3)?;
        let mut starts = Vec::with_capacity(n);
        for _ in 0..n {
            let (device, rules, segments) = (r.signed()?, r.varint()?, Self::segments(r, &frame_lists)?);
            let warnings = (0..r.count(1)?).map(|_| r.str().map(str::to_string)).collect::<Result<_, _>>()?;
            starts.push(KeptStart { device, rules, segments, warnings });
        }
        Ok(Decoded { snapshot, starts })
    }

    fn segments(r: &mut Reader, frame_lists: &[Frames]) -> Result<Vec<Segment>, Malformed> {
        let n = r.count(12)?;
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            let device = r.signed()?;
            let [address, total_size, allocated_size, active_size, requested_size] = [r.varint()?, r.varint()?, r.varint()?, r.varint()?, r.varint()?];
            let stream = r.signed()?;
            let segment_type = match r.byte()? {
                0 => PoolKind::Small,
                1 => PoolKind::Large,
                _ => return Err(Malformed),
            };
            let segment_pool_id = (r.signed()?, r.signed()?);
            let is_expandable = r.byte()? != 0;
            let frames = r.index(frame_lists)?.clone();
            let n = r.count(5)?;
            let mut blocks = Vec::with_capacity(n);
            for _ in 0..n {
                let [address, size, requested_size] = [r.varint()?, r.varint()?, r.varint()?];
                let state = match r.byte()? {
                    0 => BlockState::ActiveAllocated,
                    1 => BlockState::ActivePendingFree,
                    2 => BlockState::Inactive,
                    _ => return Err(Malformed),
                };
                let frames = r.index(frame_lists)?.clone();
                blocks.push(Block { address, size, requested_size, state, frames });
            }
            segments.push(Segment {
                device,
                address,
                total_size,
                allocated_size,
                active_size,
                requested_size,
                stream,
                segment_type,
                segment_pool_id,
                is_expandable,
                frames,
                blocks,
            });
        }
        Ok(segments)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use folder::{DEFAULT_LIMIT, Folder, WORTH_CACHING};

#[cfg(not(target_arch = "wasm32"))]
mod folder {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A folder of decoded snapshots, bounded in size: the least recently used go first.
    #[derive(Debug, Clone)]
    pub struct Folder {
        pub dir: PathBuf,
        /// Bytes the folder's cache files may take together.
        pub limit: u64,
    }

    /// Files smaller than this decode in a fraction of a second: not worth a cache file.
    pub const WORTH_CACHING: u64 = 16 << 20;
    /// The folder's default bound: room for the decodes of about ten 1 GB snapshots.
    pub const DEFAULT_LIMIT: u64 = 2 << 30;
    /// Notes of files seen (see [`Folder::seen`]) kept at most: the oldest go first.
    const SEEN_LIMIT: usize = 4096;

    impl Folder {
        /// `decoded/` in the cache folder ([`crate::files::cache_dir`]: `TENSORMEM_CACHE`,
        /// `~/.cache/tensormem` by default; none with `TENSORMEM_CACHE=off` or `memory`).
        /// Never the folder of the file being read.
        pub fn from_env() -> Option<Folder> {
            Some(Folder { dir: crate::files::cache_dir()?.join("decoded"), limit: DEFAULT_LIMIT })
        }

        fn path_of(&self, key: &SourceKey) -> PathBuf {
            self.dir.join(key.file_name())
        }

        /// Where the files seen are noted: `seen/` beside the decodes.
        fn seen_dir(&self) -> PathBuf {
            self.dir.with_file_name("seen")
        }

        /// The note of the file at `path` as it is now: its canonical path, length and
        /// modification time, hashed.
        fn seen_note(&self, path: &Path) -> Option<PathBuf> {
            let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
            let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
            let canonical = std::fs::canonicalize(path).ok()?;
            let id = xxh3_64(format!("{}\0{}\0{}", canonical.display(), meta.len(), modified.as_nanos()).as_bytes());
            Some(self.seen_dir().join(format!("{id:016x}")))
        }

        /// Whether a decode was kept when the file at `path`, as it is now (the same path,
        /// length and modification time), was last read. Only such a file is hashed before it is
        /// decoded, to look for its decode: any other is decoded at once and hashed on the way
        /// (a first open of a 1 GB file read it twice). The hash still decides: a file changed
        /// in place with its time kept is another key.
        pub fn seen(&self, path: &Path) -> bool {
            self.seen_note(path).is_some_and(|note| note.is_file())
        }

        /// The key the decode of the file at `path`, as it is now, was kept under, as its note
        /// says (a note written before notes named it says nothing). Only the file's hash tells
        /// whether its bytes are still those.
        pub fn noted_key(&self, path: &Path) -> Option<SourceKey> {
            let name = std::fs::read_to_string(self.seen_note(path)?).ok()?;
            SourceKey::from_file_name(name.trim())
        }

        /// Notes that the decode of the file at `path`, as it is now, is kept under `key` (see
        /// [`Folder::seen`]); past `SEEN_LIMIT` notes, the oldest go.
        pub fn note_seen(&self, path: &Path, key: &SourceKey) -> std::io::Result<()> {
            let Some(note) = self.seen_note(path) else { return Ok(()) };
            std::fs::create_dir_all(self.seen_dir())?;
            crate::files::write_atomically(&note, key.file_name().as_bytes())?;
            let mut notes: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(self.seen_dir())?
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    Some((entry.metadata().ok()?.modified().ok()?, entry.path()))
                })
                .collect();
            if notes.len() > SEEN_LIMIT {
                notes.sort();
                for (_, old) in &notes[..notes.len() - SEEN_LIMIT] {
                    let _ = std::fs::remove_file(old);
                }
            }
            Ok(())
        }

        /// The snapshot decoded from the source `key` names, if this folder holds it whole.
        /// A damaged file is removed (the next decode writes it again).
        pub fn get(&self, key: &SourceKey) -> Option<Decoded> {
            let path = self.path_of(key);
            let bytes = std::fs::read(&path).ok()?;
            match decode_with_starts(&bytes, key) {
                Ok(decoded) => {
                    // Used now: the last to go when the folder is over its bound.
                    if let Ok(file) = std::fs::File::options().append(true).open(&path) {
                        let _ = file.set_modified(std::time::SystemTime::now());
                    }
                    Some(decoded)
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&path);
                    None
                }
            }
        }

        /// Keeps `snapshot` (and its `starts`) for the source `key` names: written whole to a temporary name and
        /// renamed, so a reader never sees part of it; then the oldest files go until the
        /// folder is within its bound.
        pub fn put(&self, key: &SourceKey, snapshot: &Snapshot, starts: &[KeptStart]) -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let path = self.path_of(key);
            let temporary = self.dir.join(format!(".{}.{}.tmp", key.file_name(), std::process::id()));
            let written = (|| {
                let mut file = std::io::BufWriter::new(std::fs::File::create_new(&temporary)?);
                encode(snapshot, starts, key, &mut file)?;
                file.into_inner().map_err(|e| e.into_error())?;
                std::fs::rename(&temporary, &path)
            })();
            if written.is_err() {
                let _ = std::fs::remove_file(&temporary);
            }
            written?;
            self.trim(&path)
        }

        /// Removes the least recently used cache files until the rest fit the bound (`keep`,
        /// the file just written, last of all: one decode bigger than the bound is not kept).
        fn trim(&self, keep: &Path) -> std::io::Result<()> {
            let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
            for entry in std::fs::read_dir(&self.dir)? {
                let entry = entry?;
                let path = entry.path();
                if path.extension().is_none_or(|e| e != "tmdecoded") {
                    continue;
                }
                let Ok(meta) = entry.metadata() else { continue };
                let used = if path == keep { std::time::SystemTime::now() + std::time::Duration::from_secs(1 << 20) } else { meta.modified()? };
                files.push((used, meta.len(), path));
            }
            files.sort();
            let mut total: u64 = files.iter().map(|f| f.1).sum();
            for (_, len, path) in files {
                if total <= self.limit {
                    break;
                }
                std::fs::remove_file(&path)?;
                total -= len;
            }
            Ok(())
        }
    }
}
