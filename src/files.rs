//! Writing files without ever losing the one already there.
//!
//! A file is written whole to a temporary file beside it and then renamed over the target, so a
//! failed write (disk full, quota, a killed process) leaves the old file as it was, and readers
//! never see half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path`, replacing it only once everything is on disk. Missing folders are
/// created. A link is followed: the file it names is replaced and the link kept. Devices, pipes
/// and the process's own streams (`/dev/stdout`, `/dev/full`) are written in place: renaming
/// over them would replace the device node (or the link to the stream) instead of writing to it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let is_stream = path.starts_with("/dev") || path.starts_with("/proc") || std::fs::metadata(path).is_ok_and(|m| !m.is_file());
    if is_stream {
        return std::fs::OpenOptions::new().write(true).truncate(true).open(path)?.write_all(bytes);
    }
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)?,
        _ => path.to_path_buf(),
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let temporary = temporary_beside(&target, dir)?;
    let written = (|| {
        {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary)?;
            file.write_all(bytes)?;
            // On disk before the rename: after a crash the target is the old file or the new one.
            file.sync_all()?;
        }
        // The replaced file's permissions carry over (a private 0600 file stays private).
        if let Ok(old) = std::fs::metadata(&target) {
            std::fs::set_permissions(&temporary, old.permissions())?;
        }
        std::fs::rename(&temporary, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written?;
    // The rename itself is durable once the folder is synced (where folders can be opened).
    if let Ok(folder) = std::fs::File::open(dir) {
        let _ = folder.sync_all();
    }
    Ok(())
}

/// A name no other writer uses: hidden, with this process and a counter in it, in the target's
/// folder (a rename across file systems would not be atomic), short enough for any file system.
fn temporary_beside(path: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let name: String = name.to_string_lossy().chars().take(64).collect();
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(dir.join(format!(".{name}.{}-{write}.tmp", std::process::id())))
}

/// The files this process has read as inputs (snapshots, configs, run summaries), so that a
/// result is never written over one of them, whatever option named it.
static INPUTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Notes that `path` is an input of this process (see [`input_named_by`]).
pub fn note_input(path: &Path) {
    let mut inputs = INPUTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !inputs.iter().any(|p| p == path) {
        inputs.push(path.to_path_buf());
    }
}

/// The input (as it was named) that `out` would overwrite: the same file through any spelling,
/// link or hard link. Writers of results check it before writing.
pub fn input_named_by(out: &Path) -> Option<PathBuf> {
    let inputs = INPUTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    inputs.iter().find(|input| same_file(out, input)).cloned()
}

/// Reads a small input whole (a config.json, a run's JSON, a cache): at most `limit` bytes, so
/// that a huge file or an endless device (`/dev/zero`) is refused at once, with what the file
/// should be (`what`, e.g. "a config.json") and its bound. Notes it as an input.
pub fn read_small(path: &Path, limit: u64, what: &str) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    note_input(path);
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{} is larger than {}: not {what}, which is never that large", path.display(), crate::units::format_size(limit)));
    }
    String::from_utf8(bytes).map_err(|e| format!("{}: not text ({e}): not {what}", path.display()))
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

    #[cfg(unix)]
    #[test]
    fn a_link_is_followed_and_the_replaced_files_permissions_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("link");
        let real = dir.join("runs-42.pickle");
        std::fs::write(&real, b"old").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("latest.pickle");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_atomically(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&real).unwrap().permissions().mode() & 0o777, 0o600);
        let long = dir.join("x".repeat(250));
        write_atomically(&long, b"a name of 250 bytes").unwrap();
        assert_eq!(std::fs::read(&long).unwrap(), b"a name of 250 bytes");
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
