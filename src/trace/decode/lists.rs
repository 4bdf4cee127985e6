//! Where decoded trace entries are kept, by the list the pickle appended them to: each list's
//! entries pushed onto the columns of a [`Trace`]. Natively a second thread keeps them once a
//! list proves long: moving the 1 GB file's entries into fresh memory (its page faults, the
//! growing columns) was about a tenth of decoding it, on the one thread that parses. The parser's thread counts what each list holds, so that it answers
//! as if it kept them itself.

use super::*;

/// A value per list, the one used last held apart: entries come a list at a time, so most
/// appends look nothing up.
struct ByList<T> {
    others: FxHashMap<NodeId, T>,
    last: Option<(NodeId, T)>,
}

impl<T> Default for ByList<T> {
    fn default() -> Self {
        ByList { others: FxHashMap::default(), last: None }
    }
}

impl<T: Default> ByList<T> {
    fn of(&mut self, list: NodeId) -> &mut T {
        if self.last.as_ref().is_none_or(|(last, _)| *last != list) {
            if let Some((last, value)) = self.last.take() {
                self.others.insert(last, value);
            }
            self.last = Some((list, self.others.remove(&list).unwrap_or_default()));
        }
        &mut self.last.as_mut().expect("just set").1
    }

    fn values(&self) -> impl Iterator<Item = &T> {
        self.others.values().chain(self.last.iter().map(|(_, value)| value))
    }

    fn into_map(mut self) -> FxHashMap<NodeId, T> {
        if let Some((last, value)) = self.last.take() {
            self.others.insert(last, value);
        }
        self.others
    }
}

/// The entries by list.
type Kept = ByList<Growing>;

/// The parser's side: how long each list is, and where the entries are kept (here, or by the
/// second thread).
#[derive(Default)]
pub(super) struct Lists {
    lens: ByList<usize>,
    /// The entries, while they are kept on this thread: always in wasm, natively until a list
    /// is long enough for the second thread to be worth starting.
    kept: Kept,
    #[cfg(not(target_arch = "wasm32"))]
    keeper: Option<keeper::Keeper>,
}

impl Lists {
    /// Entries appended to lists so far.
    pub(super) fn entries(&self) -> usize {
        self.lens.values().sum()
    }

    /// Appends `entry` to `list`: its index there.
    pub(super) fn push(&mut self, list: NodeId, entry: TraceEntry) -> usize {
        let len = self.lens.of(list);
        let index = *len;
        *len += 1;
        #[cfg(not(target_arch = "wasm32"))]
        {
            if self.keeper.is_none() && index == keeper::FROM {
                // Where the system gives no thread, the entries stay kept here.
                match keeper::Keeper::start(std::mem::take(&mut self.kept)) {
                    Ok(keeper) => self.keeper = Some(keeper),
                    Err(kept) => self.kept = *kept,
                }
            }
            if let Some(keeper) = &mut self.keeper {
                keeper.append(list, entry);
                return index;
            }
        }
        self.kept.of(list).push(entry);
        index
    }

    /// Every list's entries, once all are kept.
    pub(super) fn finish(self) -> FxHashMap<NodeId, Growing> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(keeper) = self.keeper {
            return keeper.finish();
        }
        self.kept.into_map()
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod keeper {
    use super::*;
    use std::sync::mpsc;

    /// A list this long has its entries kept by a second thread (one for every short file
    /// would cost more than it saves).
    pub(super) const FROM: usize = 1 << 16;
    /// Entries handed over at a time.
    const BATCH: usize = 1 << 12;

    type Batch = Vec<(NodeId, TraceEntry)>;

    /// The thread that keeps the entries, and the batch being filled for it.
    pub(super) struct Keeper {
        batch: Batch,
        /// At most a few batches wait (a megabyte or two); spent ones come back to be refilled.
        full: mpsc::SyncSender<Batch>,
        spent: mpsc::Receiver<Batch>,
        thread: std::thread::JoinHandle<Kept>,
    }

    impl Keeper {
        /// Goes on keeping after what `kept` holds; gives it back if no thread can be started.
        pub(super) fn start(kept: Kept) -> std::result::Result<Keeper, Box<Kept>> {
            let (full, batches) = mpsc::sync_channel::<Batch>(4);
            let (spent_tx, spent) = mpsc::channel();
            // Handed to the thread through a slot, so that it comes back if none starts.
            let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(kept)));
            let handed = slot.clone();
            // A parse that fails drops the sender: the thread ends, and frees what it kept.
            let started = std::thread::Builder::new().name("tensormem-keep-entries".into()).spawn(move || {
                let mut kept = handed.lock().expect("taken once").take().expect("handed over");
                for mut batch in batches {
                    for (list, entry) in batch.drain(..) {
                        kept.of(list).push(entry);
                    }
                    let _ = spent_tx.send(batch);
                }
                kept
            });
            match started {
                Ok(thread) => Ok(Keeper { batch: Vec::with_capacity(BATCH), full, spent, thread }),
                Err(_) => Err(Box::new(slot.lock().expect("no thread holds it").take().expect("never handed over"))),
            }
        }

        pub(super) fn append(&mut self, list: NodeId, entry: TraceEntry) {
            self.batch.push((list, entry));
            if self.batch.len() == BATCH {
                self.send();
            }
        }

        fn send(&mut self) {
            let next = self.spent.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH));
            let batch = std::mem::replace(&mut self.batch, next);
            // Only a panic ends the thread before this sender is dropped: `finish` says so.
            let _ = self.full.send(batch);
        }

        pub(super) fn finish(mut self) -> FxHashMap<NodeId, Growing> {
            if !self.batch.is_empty() {
                self.send();
            }
            drop(self.full);
            match self.thread.join() {
                Ok(kept) => kept.into_map(),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }
}

/// A growing list of entries, as the columns of a [`Trace`]: each column grows on its own, so
/// growing copies a column at a time (in wasm, where a grown buffer is copied) instead of the
/// whole trace, and `into_trace` hands the columns over without their room to grow.
#[derive(Default)]
pub(super) struct Growing {
    trace: Trace,
    /// Which entries `take` took, once it took any (a list the pickle wrote out of order).
    taken: Vec<bool>,
    pub(super) len: usize,
}

impl Growing {
    pub(super) fn push(&mut self, entry: TraceEntry) {
        self.trace.push(entry);
        self.len += 1;
    }

    /// A copy of entry `i`, unless it was taken already (a list the pickle wrote out of order,
    /// whose entries are read by index: the list's own trace is then dropped unused).
    pub(super) fn take(&mut self, i: usize) -> Option<TraceEntry> {
        if self.taken.is_empty() {
            self.taken = vec![false; self.len];
        }
        let taken = self.taken.get_mut(i)?;
        if std::mem::replace(taken, true) {
            return None;
        }
        Some(self.trace.at(i).owned())
    }

    /// Every entry, in order, of a list none of whose entries were taken.
    pub(super) fn into_trace(mut self) -> Trace {
        self.trace.shrink_to_fit();
        self.trace
    }
}
