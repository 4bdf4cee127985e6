//! Writers: JSON (serde) and a protocol-4 pickle that pytorch.org/memory_viz and Python load.
//!
//! The pickle memoizes every shared frame list once, as PyTorch's own dumps do, so files stay small.

use super::Entry;
use super::model::*;
use std::collections::HashMap;

pub fn to_json(snapshot: &Snapshot) -> String {
    serde_json::to_string(snapshot).expect("a snapshot always serializes")
}

pub fn to_pickle(snapshot: &Snapshot) -> Vec<u8> {
    let mut w = PickleWriter::default();
    w.out.extend_from_slice(&[0x80, 4]);
    w.snapshot(snapshot);
    w.out.push(b'.');
    w.out
}

#[derive(Default)]
struct PickleWriter {
    out: Vec<u8>,
    memo_count: u32,
    shared: HashMap<*const Frame, u32>,
    strings: HashMap<String, u32>,
}

impl PickleWriter {
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo_count += 1;
        self.memo_count - 1
    }

    fn get(&mut self, idx: u32) {
        if idx < 256 {
            self.out.extend_from_slice(&[b'h', idx as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
    }

    fn str(&mut self, s: &str) {
        // Repeated strings (keys, filenames, state names) are memoized like Python does.
        if let Some(&idx) = self.strings.get(s) {
            return self.get(idx);
        }
        if s.len() < 256 {
            self.out.push(0x8c);
            self.out.push(s.len() as u8);
        } else {
            self.out.push(b'X');
            self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(s.as_bytes());
        let idx = self.memoize();
        self.strings.insert(s.to_string(), idx);
    }

    fn int(&mut self, v: i64) {
        if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if i32::try_from(v).is_ok() {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // LONG1 with the shortest two's complement encoding.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let below_sign = bytes[n - 2] & 0x80 != 0;
                if (top == 0 && !below_sign) || (top == 0xff && below_sign) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn uint(&mut self, v: u64) {
        match i64::try_from(v) {
            Ok(i) => self.int(i),
            Err(_) => {
                // LONG1 of 9 bytes: the value plus a zero sign byte.
                self.out.extend_from_slice(&[0x8a, 9]);
                self.out.extend_from_slice(&v.to_le_bytes());
                self.out.push(0);
            }
        }
    }

    fn bool(&mut self, b: bool) {
        self.out.push(if b { 0x88 } else { 0x89 });
    }

    fn float(&mut self, f: f64) {
        self.out.push(b'G');
        self.out.extend_from_slice(&f.to_be_bytes());
    }

    /// A dict: `body` writes key/value pairs.
    fn dict(&mut self, body: impl FnOnce(&mut Self)) {
        self.out.push(b'}');
        self.memoize();
        self.out.push(b'(');
        body(self);
        self.out.push(b'u');
    }

    fn list<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) {
        self.list_of(items.iter(), |w, item| each(w, item));
    }

    /// A list, appended 1,000 items at a time as `pickle` does.
    fn list_of<I: ExactSizeIterator>(&mut self, mut items: I, mut each: impl FnMut(&mut Self, I::Item)) {
        self.out.push(b']');
        self.memoize();
        while items.len() > 0 {
            self.out.push(b'(');
            for item in items.by_ref().take(1000) {
                each(self, item);
            }
            self.out.push(b'e');
        }
    }

    fn frames(&mut self, frames: &Frames) {
        let key = frames.as_ptr();
        if !frames.is_empty()
            && let Some(&idx) = self.shared.get(&key)
        {
            return self.get(idx);
        }
        self.out.push(b']');
        let idx = self.memoize();
        if !frames.is_empty() {
            self.shared.insert(key, idx);
            self.out.push(b'(');
            for f in frames.iter() {
                self.dict(|w| {
                    w.str("filename");
                    w.str(&f.filename);
                    w.str("line");
                    w.uint(f.line);
                    w.str("name");
                    w.str(&f.name);
                });
            }
            self.out.push(b'e');
        }
    }

    fn json(&mut self, v: &serde_json::Value) {
        use serde_json::Value;
        match v {
            Value::Null => self.out.push(b'N'),
            Value::Bool(b) => self.bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => self.int(i),
                None => self.float(n.as_f64().unwrap_or(0.0)),
            },
            Value::String(s) => self.str(s),
            Value::Array(items) => self.list(items, |w, i| w.json(i)),
            Value::Object(map) => self.dict(|w| {
                for (k, v) in map {
                    w.str(k);
                    w.json(v);
                }
            }),
        }
    }

    fn block(&mut self, b: &Block) {
        self.dict(|w| {
            w.str("address");
            w.uint(b.address);
            w.str("size");
            w.uint(b.size);
            w.str("requested_size");
            w.uint(b.requested_size);
            w.str("state");
            w.str(match b.state {
                BlockState::ActiveAllocated => "active_allocated",
                BlockState::ActivePendingFree => "active_pending_free",
                BlockState::Inactive => "inactive",
            });
            w.str("frames");
            w.frames(&b.frames);
        });
    }

    fn segment(&mut self, s: &Segment) {
        self.dict(|w| {
            for (key, value) in [
                ("device", s.device),
                ("address", s.address as i64),
                ("total_size", s.total_size as i64),
                ("allocated_size", s.allocated_size as i64),
                ("active_size", s.active_size as i64),
                ("requested_size", s.requested_size as i64),
                ("stream", s.stream),
            ] {
                w.str(key);
                w.int(value);
            }
            w.str("segment_type");
            w.str(match s.segment_type {
                PoolKind::Small => "small",
                PoolKind::Large => "large",
            });
            w.str("segment_pool_id");
            w.int(s.segment_pool_id.0);
            w.int(s.segment_pool_id.1);
            w.out.push(0x86);
            w.memoize();
            w.str("is_expandable");
            w.bool(s.is_expandable);
            w.str("frames");
            w.frames(&s.frames);
            w.str("blocks");
            w.list(&s.blocks, |w, b| w.block(b));
        });
    }

    /// One trace entry; `unknown_category`: written `unknown` ([`Trace::unknown_categories`]).
    fn entry(&mut self, e: Entry<'_>, unknown_category: bool) {
        self.dict(|w| {
            w.str("action");
            w.str(e.action.name());
            if let Some(free) = e.device_free() {
                w.str("device_free");
                w.uint(free);
            } else {
                w.str("addr");
                w.uint(e.addr);
            }
            w.str("size");
            w.uint(e.size);
            w.str("stream");
            w.int(e.stream);
            if let Some(t) = e.time_us {
                w.str("time_us");
                w.int(t);
            }
            if let Some(c) = e.compile_context() {
                w.str("compile_context");
                w.str(c);
            }
            if let Some(m) = e.user_metadata() {
                w.str("user_metadata");
                w.str(m);
            }
            if let Some((a, b)) = e.pool_id() {
                w.str("pool_id");
                w.int(a);
                w.int(b);
                w.out.push(0x86);
                w.memoize();
            }
            if let Some(c) = e.category {
                w.str("category");
                w.str(c.name());
            } else if unknown_category {
                w.str("category");
                w.str(Category::UNKNOWN);
            }
            if let Some(f) = &e.frames {
                w.str("frames");
                w.frames(f);
            }
        });
    }

    fn snapshot(&mut self, s: &Snapshot) {
        self.dict(|w| {
            w.str("segments");
            w.list(&s.segments, |w, seg| w.segment(seg));
            w.str("device_traces");
            w.list(&s.device_traces, |w, t| {
                let unknown = t.unknown_categories();
                w.list_of(t.iter().enumerate(), |w, (i, e)| w.entry(e, unknown.on(i, &e)))
            });
            if let Some(settings) = &s.allocator_settings {
                w.str("allocator_settings");
                w.json(&serde_json::Value::Object(settings.clone()));
            }
            if let Some(ann) = &s.external_annotations {
                w.str("external_annotations");
                w.list(ann, |w, a| {
                    w.dict(|w| {
                        w.str("name");
                        w.str(&a.name);
                        w.str("stage");
                        w.str(&a.stage);
                        w.str("device");
                        w.int(a.device);
                        if let Some(t) = a.time_us {
                            w.str("time_us");
                            w.int(t);
                        }
                    })
                });
            }
            if let Some(r) = &s.tensormem {
                w.str("tensormem");
                w.dict(|w| {
                    w.str("time");
                    w.str(&r.time);
                    w.str("device");
                    w.str(&r.device);
                });
            }
        });
    }
}
