//! Writing files without ever losing the one already there.
//!
//! A file is written whole to a temporary file beside it and then renamed over the target, so a
//! failed write (disk full, quota, a killed process) leaves the old file as it was, and readers
//! never see half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path`, replacing it only once everything is on disk. Missing folders are
/// created. A target that exists and is not a regular file (`/dev/stdout`, a pipe) is written
/// in place: renaming over it would replace the device node instead of writing to it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return std::fs::OpenOptions::new().write(true).open(path)?.write_all(bytes);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let temporary = temporary_beside(path, dir)?;
    let written = (|| {
        {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary)?;
            file.write_all(bytes)?;
            // On disk before the rename: after a crash the target is the old file or the new one.
            file.sync_all()?;
        }
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// A name no other writer uses: hidden, with this process and a counter in it, in the target's
/// folder (a rename across file systems would not be atomic).
fn temporary_beside(path: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(dir.join(format!(".{}.{}-{write}.tmp", name.to_string_lossy(), std::process::id())))
}

/// Whether two paths name the same existing file (through links, `..` or another spelling).
pub fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else { return false };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (ma.dev(), ma.ino()) == (mb.dev(), mb.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = (ma, mb);
        matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tensormem-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = scratch("replace");
        let path = dir.join("out.json");
        std::fs::write(&path, b"old").unwrap();
        write_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the target remains");
        let nested = dir.join("a/b/c.pickle");
        write_atomically(&nested, b"x").unwrap();
        assert_eq!(std::fs::read(&nested).unwrap(), b"x");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_write_to_a_device_is_an_error() {
        // /dev/full accepts opening and refuses every byte: the error reaches the caller.
        let err = write_atomically(Path::new("/dev/full"), b"bytes").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28), "ENOSPC: {err}");
    }

    #[test]
    fn same_file_sees_through_spellings() {
        let dir = scratch("same");
        let path = dir.join("a.pickle");
        std::fs::write(&path, b"a").unwrap();
        std::fs::create_dir_all(dir.join("x")).unwrap();
        assert!(same_file(&path, &dir.join("x/../a.pickle")));
        assert!(!same_file(&path, &dir.join("b.pickle")), "a missing file is no input");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
