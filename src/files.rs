//! Writing files without ever losing the one already there.
//!
//! A file is written whole to a temporary file beside it and then renamed over the target, so a
//! failed write (disk full, quota, a killed process) leaves the old file as it was, and readers
//! never see half a file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path`, replacing it only once everything is on disk. The folder must
/// exist: a mistyped folder is an error, not a new tree of folders (callers that keep files of
/// their own, such as a cache, make theirs first). A link is followed: the file it names is replaced and the link kept. Devices, pipes
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
    if !dir.is_dir() {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no folder {}", dir.display())));
    }
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

/// The folder where tensormem keeps what it can make again (measured matmul kernels, decoded
/// snapshots): `TENSORMEM_CACHE` when it names a folder, else `TENSORMEM_CACHE_DIR` (its older
/// name), else `$XDG_CACHE_HOME/tensormem`, else `~/.cache/tensormem` (`%LOCALAPPDATA%\tensormem`
/// on Windows). None with `TENSORMEM_CACHE=memory` or `off`: nothing is kept on disk (what
/// `tensormem mcp` runs its tools with).
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_named_by(|name| std::env::var_os(name))
}

/// [`cache_dir`] as the environment `env` names it.
pub fn cache_dir_named_by(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    match var("TENSORMEM_CACHE") {
        Some(v) if v.as_os_str() == "memory" || v.as_os_str() == "off" => return None,
        Some(folder) => return Some(folder),
        None => {}
    }
    var("TENSORMEM_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tensormem")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tensormem")))
        .or_else(|| var("LOCALAPPDATA").map(|d| d.join("tensormem")))
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

/// How long an input that is a named pipe may wait for its first byte before it is an error
/// (`TENSORMEM_PIPE_WAIT` seconds; default 10): a pipe nobody writes to would block for ever.
#[cfg(unix)]
fn pipe_wait() -> std::time::Duration {
    let seconds = std::env::var("TENSORMEM_PIPE_WAIT").ok().and_then(|s| s.trim().parse::<f64>().ok()).filter(|s| s.is_finite() && *s >= 0.0);
    std::time::Duration::from_secs_f64(seconds.unwrap_or(10.0))
}

/// Opens an input to read it front to back; returns the file and its length when it is a
/// regular file (None for a pipe, whose length says nothing). A folder is refused; a pipe
/// (`cat f | tensormem doctor /dev/stdin`, `<(zcat f.gz)`) is read to its end. A named pipe in
/// the file system is opened without waiting for a writer, and one that sends nothing within
/// `TENSORMEM_PIPE_WAIT` seconds is an error: opening it plainly would block for ever. The
/// process's own streams (`/dev/stdin`, `/dev/fd/N`, `/proc/self/fd/N`) have their writer
/// already and wait as long as it takes.
pub fn open_input(path: &Path) -> std::io::Result<(std::fs::File, Option<u64>)> {
    use std::io::{Error, ErrorKind};
    let file = open_without_waiting(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(Error::new(ErrorKind::InvalidInput, "a folder, not a file"));
    }
    if meta.is_file() {
        return Ok((file, Some(meta.len())));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_fifo() && !is_own_stream(path) {
            wait_for_writer(&file, pipe_wait())?;
        }
        blocking(&file)?;
    }
    Ok((file, None))
}

/// `/dev/stdin`, `/dev/fd/N`, `/proc/self/fd/N`: a descriptor this process was given, whose
/// writer exists or has been.
#[cfg(unix)]
fn is_own_stream(path: &Path) -> bool {
    let own = format!("/proc/{}/fd", std::process::id());
    ["/dev/stdin", "/dev/fd", "/proc/self/fd", "/proc/thread-self/fd", own.as_str()].iter().any(|p| path.starts_with(p))
}

#[cfg(unix)]
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

#[cfg(not(unix))]
fn open_without_waiting(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// Waits until a named pipe has something to read or its writer has come and gone.
#[cfg(unix)]
fn wait_for_writer(file: &std::fs::File, limit: std::time::Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut poll = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if ready > 0 {
            return Ok(());
        }
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if left.is_zero() || std::time::Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "a named pipe that nothing was written to in {} s (no writer?): give a snapshot file, or start the writer first (TENSORMEM_PIPE_WAIT sets the wait)",
                    limit.as_secs_f64()
                ),
            ));
        }
    }
}

/// Reads from now on wait for data again (the file was opened not to wait for a writer).
#[cfg(unix)]
fn blocking(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this file owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reads a small input whole (a config.json, a run's JSON, a cache): at most `limit` bytes, so
/// that a huge file or an endless device (`/dev/zero`) is refused at once, with what the file
/// should be (`what`, e.g. "a config.json") and its bound. Notes it as an input.
pub fn read_small(path: &Path, limit: u64, what: &str) -> Result<String, String> {
    use std::io::Read;
    let (file, _) = open_input(path).map_err(|e| format!("{}: {e}", path.display()))?;
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
        // A missing folder is not made: the write fails and nothing appears.
        let nested = dir.join("a/b/c.pickle");
        let err = write_atomically(&nested, b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("no folder"), "{err}");
        assert!(!dir.join("a").exists());
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
