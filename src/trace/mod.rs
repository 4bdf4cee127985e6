//! Pure data: trace events, the snapshot model, and PyTorch snapshot reading and writing.
//!
//! Reading accepts pickle (protocols 2-5, plain data only: any global is refused) and JSON; the
//! format is told by the first byte. Writing gives JSON or a protocol-4 pickle, both of which
//! pytorch.org/memory_viz loads.

mod decode;
mod model;
mod node;
mod pickle;
mod write;

pub use model::*;
pub use pickle::PickleError;
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
    let first = data.iter().copied().find(|b| !b.is_ascii_whitespace());
    let (arena, root) = match first {
        Some(0x80) => pickle::parse(data)?,
        Some(b'{') | Some(b'[') => {
            let value: serde_json::Value = serde_json::from_slice(data)?;
            node::Arena::from_json(&value)
        }
        Some(b) => {
            let looks_like = if data.iter().take(512).all(|c| c.is_ascii_graphic() || c.is_ascii_whitespace()) { "text" } else { "binary data" };
            return Err(TraceError::UnknownFormat(format!(
                "it looks like {looks_like} (first byte 0x{b:02x}), but a snapshot is a pickle from torch.cuda.memory._dump_snapshot (first byte 0x80) or its JSON"
            )));
        }
        None => return Err(TraceError::UnknownFormat("the file is empty".into())),
    };
    Ok(decode::snapshot(&arena, root)?)
}

pub fn load_file(path: &Path) -> Result<Snapshot, TraceError> {
    let data = std::fs::read(path).map_err(|source| TraceError::Io { path: path.display().to_string(), source })?;
    load(&data)
}

pub fn save_file(snapshot: &Snapshot, path: &Path) -> Result<(), TraceError> {
    let bytes = match Format::from_path(path) {
        Format::Json => to_json(snapshot).into_bytes(),
        Format::Pickle => to_pickle(snapshot),
    };
    std::fs::write(path, bytes).map_err(|source| TraceError::Io { path: path.display().to_string(), source })
}
