//! Trace shapes that stress the analysis (the hostile inputs of issue 30), built in memory: the
//! same snapshots `../shared/repro/*.py` write as pickles.
#![allow(dead_code)]

use std::sync::Arc;
use tensormem::trace::{Action, Frame, Frames, Snapshot, TraceEntry};

const BASE: u64 = 0x7f00_0000_0000;

fn entry(action: Action, addr: u64, size: u64, time_us: i64, frames: &Frames) -> TraceEntry {
    TraceEntry { action, addr, size, stream: 0, time_us: Some(time_us), frames: Some(frames.clone()), category: None, extra: None }
}

fn free(trace: &mut Vec<TraceEntry>, addr: u64, t: i64, frames: &Frames) {
    trace.push(entry(Action::FreeRequested, addr, 512, t, frames));
    trace.push(entry(Action::FreeCompleted, addr, 512, t, frames));
}

/// `n` allocations of 512 bytes live at once, then freed oldest first (`fifo`) or newest first.
pub fn queue(n: u64, fifo: bool) -> Snapshot {
    let none: Frames = Arc::from(Vec::new());
    let mut trace = vec![entry(Action::SegmentAlloc, BASE, 1 << 30, 0, &none)];
    for k in 0..n {
        trace.push(entry(Action::Alloc, BASE + 512 * k, 512, k as i64, &none));
    }
    for j in 0..n {
        let k = if fifo { j } else { n - 1 - j };
        free(&mut trace, BASE + 512 * k, (n + j) as i64, &none);
    }
    Snapshot { device_traces: vec![trace.into()], ..Default::default() }
}

/// A sliding window: `n` allocations, each new one freeing the oldest once `w` are live.
pub fn window(n: u64, w: u64) -> Snapshot {
    let none: Frames = Arc::from(Vec::new());
    let slot = |k: u64| BASE + 512 * (k % (w + 1));
    let mut trace = vec![entry(Action::SegmentAlloc, BASE, 1 << 30, 0, &none)];
    let mut t = 0;
    for k in 0..n {
        t += 1;
        trace.push(entry(Action::Alloc, slot(k), 512, t, &none));
        if k >= w {
            t += 1;
            free(&mut trace, slot(k - w), t, &none);
        }
    }
    Snapshot { device_traces: vec![trace.into()], ..Default::default() }
}

/// `n` allocations (each freed at once) sharing one stack of `depth` frames, as a pickle's memo
/// shares one frame list.
pub fn shared_stack(n: u64, depth: usize) -> Snapshot {
    let frames: Frames = Arc::from(vec![Frame { filename: "/x/t.py".into(), line: 1, name: "main".into() }; depth]);
    let mut trace = vec![entry(Action::SegmentAlloc, BASE, 1 << 30, 0, &frames)];
    for k in 0..n {
        trace.push(entry(Action::Alloc, BASE, 512, 2 * k as i64, &frames));
        free(&mut trace, BASE, 2 * k as i64 + 1, &frames);
    }
    Snapshot { device_traces: vec![trace.into()], ..Default::default() }
}
