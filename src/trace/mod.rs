//! Pure data: trace events, the snapshot model, and PyTorch snapshot reading and writing.
//!
//! Reading accepts pickle (protocols 2-5, plain data only: any global is refused) and JSON; the
//! format is told by the first byte. Writing gives JSON or a protocol-4 pickle, both of which
//! pytorch.org/memory_viz loads.

pub mod cache;
mod columns;
mod decode;
mod model;
mod node;
mod pickle;
mod totals;
mod write;

pub use columns::{Entry, Iter, StackId, Trace, UnknownCategories};
pub use model::*;
pub use pickle::PickleError;
pub use totals::{Totals, running_totals};
pub use write::{to_json, to_pickle};

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{0}")]
    Pickle(#[from] PickleError),
    #[error("bad JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    #[error("not a snapshot: {0}")]
    UnknownFormat(String),
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

impl From<decode::FieldError> for TraceError {
    fn from(e: decode::FieldError) -> TraceError {
        TraceError::Field { path: e.path, message: e.message }
    }
}

/// Which file format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Pickle,
}

impl Format {
    /// `.json` means JSON; anything else (`.pickle`, `.pkl`) a pickle, like `_dump_snapshot`.
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("json") => Format::Json,
            _ => Format::Pickle,
        }
    }
}

/// Parses a snapshot from bytes, pickle or JSON.
pub fn load(data: &[u8]) -> Result<Snapshot, TraceError> {
    let mut loader = Loader::new(Some(data.len()));
    loader.feed(data)?;
    loader.finish()
}

/// Reads a snapshot fed in chunks, as a file streams in. A pickle is parsed as it arrives and its
/// trace entries are decoded on the way, so the whole file is never held (neither its bytes nor
/// its node tree); JSON is gathered and parsed at the end.
pub struct Loader {
    state: LoaderState,
    total: Option<usize>,
}

enum LoaderState {
    /// Nothing but whitespace yet: the format is not known.
    Start(Vec<u8>),
    Pickle(Box<pickle::Parser>, Box<decode::EntryCompactor>),
    Json(Vec<u8>),
}

impl Loader {
    /// `total`: the file's length when known.
    pub fn new(total: Option<usize>) -> Loader {
        Loader { state: LoaderState::Start(Vec::new()), total }
    }

    /// Trace entries decoded so far (a pickle's, as it streams; a JSON text is decoded at the end).
    pub fn entries_decoded(&self) -> usize {
        match &self.state {
            LoaderState::Pickle(_, compactor) => compactor.entries(),
            _ => 0,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), TraceError> {
        match &mut self.state {
            LoaderState::Start(seen) => {
                let Some(first) = chunk.iter().copied().find(|b| !b.is_ascii_whitespace()) else {
                    seen.extend_from_slice(chunk);
                    return Ok(());
                };
                match first {
                    0x80 => {
                        let mut parser = Box::new(pickle::Parser::new(self.total));
                        let mut compactor = Box::<decode::EntryCompactor>::default();
                        parser.feed(seen, &mut *compactor)?;
                        parser.feed(chunk, &mut *compactor)?;
                        self.state = LoaderState::Pickle(parser, compactor);
                    }
                    b'{' | b'[' => {
                        let mut bytes = std::mem::take(seen);
                        bytes.extend_from_slice(chunk);
                        self.state = LoaderState::Json(bytes);
                    }
                    b => {
                        let looks_like = if chunk.iter().take(512).all(|c| c.is_ascii_graphic() || c.is_ascii_whitespace()) { "text" } else { "binary data" };
                        return Err(TraceError::UnknownFormat(format!(
                            "it looks like {looks_like} (first byte 0x{b:02x}), but a snapshot is a pickle from torch.cuda.memory._dump_snapshot (first byte 0x80) or its JSON"
                        )));
                    }
                }
            }
            LoaderState::Pickle(parser, compactor) => parser.feed(chunk, &mut **compactor)?,
            LoaderState::Json(bytes) => bytes.extend_from_slice(chunk),
        }
        Ok(())
    }

    /// Bytes fed so far.
    pub fn position(&self) -> usize {
        match &self.state {
            LoaderState::Start(b) | LoaderState::Json(b) => b.len(),
            LoaderState::Pickle(p, _) => p.position(),
        }
    }

    pub fn finish(self) -> Result<Snapshot, TraceError> {
        match self.state {
            LoaderState::Start(_) => Err(TraceError::UnknownFormat("the file is empty".into())),
            LoaderState::Pickle(parser, mut compactor) => {
                let (arena, root) = parser.finish(&mut *compactor)?;
                Ok(decode::snapshot(&arena, root, *compactor)?)
            }
            LoaderState::Json(bytes) => {
                let mut compactor = decode::EntryCompactor::unshared();
                let (arena, root) = node::Arena::parse_json(&bytes, &mut compactor)?;
                drop(bytes);
                Ok(decode::snapshot(&arena, root, compactor)?)
            }
        }
    }
}

/// Reads a snapshot file as a stream (a 1 GB pickle is never held whole).
pub fn load_file(path: &Path) -> Result<Snapshot, TraceError> {
    load_file_with_progress(path, &mut |_| {})
}

/// How far a file's reading has got: for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct LoadProgress {
    pub bytes_read: usize,
    /// The file's length, when it has one (a pipe has none).
    pub total_bytes: Option<usize>,
    pub entries_decoded: usize,
}

/// [`load_file`], telling `progress` after each chunk read.
pub fn load_file_with_progress(path: &Path, progress: &mut dyn FnMut(LoadProgress)) -> Result<Snapshot, TraceError> {
    load_file_keyed(path, progress).map(|(snapshot, _)| snapshot)
}

/// [`load_file_with_progress`], with the key of the bytes it read (for [`cache::Folder::put`]:
/// hashed as they were parsed, so a file that changes while it is read is kept under the key
/// of what was decoded).
pub fn load_file_keyed(path: &Path, progress: &mut dyn FnMut(LoadProgress)) -> Result<(Snapshot, cache::SourceKey), TraceError> {
    let mut loader = None;
    let (total, key) = read_chunks_keyed(path, &mut |chunk, total| {
        let loader = loader.get_or_insert_with(|| Loader::new(total));
        loader.feed(chunk)?;
        progress(LoadProgress { bytes_read: loader.position(), total_bytes: total, entries_decoded: loader.entries_decoded() });
        Ok(())
    })?;
    let loader = loader.unwrap_or_else(|| Loader::new(total));
    Ok((loader.finish()?, key))
}

/// The key of a file's bytes (its length and hash), telling `progress` as it reads.
pub fn key_of_file(path: &Path, progress: &mut dyn FnMut(LoadProgress)) -> Result<cache::SourceKey, TraceError> {
    let mut hasher = cache::SourceHasher::default();
    read_chunks(path, &mut |chunk, total| {
        hasher.update(chunk);
        progress(LoadProgress { bytes_read: hasher.bytes_hashed() as usize, total_bytes: total, entries_decoded: 0 });
        Ok(())
    })?;
    Ok(hasher.finish())
}

/// What [`read_chunks`] gives each chunk to, with the file's length.
type ChunkReader<'a> = dyn FnMut(&[u8], Option<usize>) -> Result<(), TraceError> + 'a;

/// How much [`read_chunks`] reads at a time.
const CHUNK: usize = 1 << 20;

/// Reads a file (or pipe) a megabyte at a time, giving each chunk and the file's length, when
/// it has one (a pipe's length is no length), to `each`. Returns that length.
fn read_chunks(path: &Path, each: &mut ChunkReader) -> Result<Option<usize>, TraceError> {
    let (mut file, total) = open_chunks(path)?;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = read_some(&mut file, &mut chunk, path)?;
        if n == 0 {
            return Ok(total);
        }
        each(&chunk[..n], total)?;
    }
}

/// The file (or pipe) at `path`, opened for [`read_some`], and its length when it has one.
fn open_chunks(path: &Path) -> Result<(std::fs::File, Option<usize>), TraceError> {
    let (file, length) = crate::files::open_input(path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
    crate::files::note_input(path);
    Ok((file, length.map(|n| n as usize)))
}

/// The next bytes of `file` into `chunk`, how many (0 at its end).
fn read_some(file: &mut std::fs::File, chunk: &mut [u8], path: &Path) -> Result<usize, TraceError> {
    use std::io::Read;
    loop {
        match file.read(chunk) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => return read.map_err(|source| TraceError::Io { path: path.display().to_string(), source }),
        }
    }
}

/// [`read_chunks`], with the key of the bytes read. Natively a second thread reads and hashes
/// the next chunks while `each` decodes this one (a 1 GB file: 0.2 s of reading and hashing off
/// the decoder's thread); a chunk the decoder refuses stops the reading.
fn read_chunks_keyed(path: &Path, each: &mut ChunkReader) -> Result<(Option<usize>, cache::SourceKey), TraceError> {
    #[cfg(target_arch = "wasm32")]
    {
        let mut hasher = cache::SourceHasher::default();
        let total = read_chunks(path, &mut |chunk, total| {
            hasher.update(chunk);
            each(chunk, total)
        })?;
        Ok((total, hasher.finish()))
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::mpsc;
        let (mut file, total) = open_chunks(path)?;
        // A few chunks ahead at most; the decoder sends spent buffers back for reuse.
        let (read_tx, read_rx) = mpsc::sync_channel::<(Vec<u8>, usize)>(4);
        let (spent_tx, spent_rx) = mpsc::channel::<Vec<u8>>();
        let owned = path.to_path_buf();
        // Not scoped: a decoder that refuses a chunk returns at once, even while the reader waits
        // on a silent pipe; the reader ends at its next chunk (its send fails) or the pipe's end.
        let reader = std::thread::spawn(move || -> Result<cache::SourceKey, TraceError> {
            let mut hasher = cache::SourceHasher::default();
            loop {
                let mut chunk = spent_rx.try_recv().unwrap_or_else(|_| vec![0u8; CHUNK]);
                let n = read_some(&mut file, &mut chunk, &owned)?;
                if n == 0 {
                    return Ok(hasher.finish());
                }
                hasher.update(&chunk[..n]);
                if read_tx.send((chunk, n)).is_err() {
                    return Ok(hasher.finish());
                }
            }
        });
        for (chunk, n) in read_rx.iter() {
            each(&chunk[..n], total)?;
            let _ = spent_tx.send(chunk);
        }
        let key = reader.join().expect("the reading thread does not panic")?;
        Ok((total, key))
    }
}

/// Writes a snapshot (`.json` as JSON, anything else as a pickle); an existing file is replaced
/// only once the new one is whole on disk.
pub fn save_file(snapshot: &Snapshot, path: &Path) -> Result<(), TraceError> {
    let bytes = match Format::from_path(path) {
        Format::Json => to_json(snapshot).into_bytes(),
        Format::Pickle => to_pickle(snapshot),
    };
    crate::files::write_atomically(path, &bytes).map_err(|source| TraceError::Write { path: path.display().to_string(), source })
}
