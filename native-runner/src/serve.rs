//! `tensormem serve`: a small static HTTP/1.1 server for the web page (`www/`, with the wasm build
//! in `www/pkg/`) and, optionally, one snapshot file at `/snapshot/<basename>`.
//!
//! GET and HEAD only, one thread per connection, `Connection: close` after every response. Paths
//! are percent-decoded, checked component by component, canonicalized and kept inside the root:
//! nothing outside it is ever served. An error on one connection (a client that goes away
//! mid-response, say) ends that connection only.
//!
//! Bound to a loopback address (the default), it answers only requests addressed to this machine
//! by name (`Host: 127.0.0.1`, `localhost`, `[::1]`): a web page elsewhere cannot use DNS
//! rebinding to read the snapshot through the user's browser. Requests must be well formed
//! (RFC 9112): a header line without a colon, or an HTTP/1.1 request without exactly one Host, is
//! answered 400.
//!
//! Threads are bounded: at most 64 connections are open at once (and 128 threads, while those it
//! closed wind down), and a request head must arrive within a deadline. When all 64 are taken, a
//! new connection closes the one that has been idle the longest (waiting for its request head,
//! past its response, or with a response its reader has held up for over 10 s), so sockets that
//! say nothing, or read nothing, cannot keep requests out.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Longest request head (request line and headers) accepted.
const MAX_HEAD: u64 = 16 * 1024;
/// Connections open at once; a new one beyond closes the longest idle.
const MAX_CONNECTIONS: usize = 64;
/// Threads at most: closed connections whose threads have not yet noticed still count, so a
/// platform where closing a socket does not wake its reader cannot pile up threads either.
const MAX_THREADS: usize = 2 * MAX_CONNECTIONS;
/// Time a client has to send its whole request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Time given to read what a client still sends after the response (see `handle`).
const DRAIN_DEADLINE: Duration = Duration::from_secs(1);
/// A response still being sent after this long is held up by its reader: its place may be taken
/// as an idle one's may (a client reading a byte a minute must not hold a place for ever).
const SLOW_RESPONSE: Duration = Duration::from_secs(10);

/// What the server serves: the canonical web root and the optional snapshot.
struct Site {
    root: PathBuf,
    /// Decoded URL path (`/snapshot/<basename>` as bytes) and the file's canonical path.
    snapshot: Option<(Vec<u8>, PathBuf)>,
    /// Listening on loopback: only requests naming this machine are answered.
    loopback: bool,
    connections: Mutex<Connections>,
}

/// The connections that hold a thread.
#[derive(Default)]
struct Connections {
    list: Vec<Connection>,
    next_id: u64,
}

struct Connection {
    id: u64,
    /// A handle to the socket, to close it from the accepting thread.
    stream: TcpStream,
    /// From when it may be closed to make room: when it began waiting for its client, or
    /// `SLOW_RESPONSE` after it began answering.
    evictable_from: Instant,
    /// Closed to make room; its thread ends at its next read.
    closed: bool,
}

impl Site {
    fn connections(&self) -> MutexGuard<'_, Connections> {
        // The list stays consistent whatever a panicking thread was doing.
        self.connections.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection, closing the longest idle one if all places are taken; `None`
    /// when no place can be made (all busy answering requests, or too many threads still ending).
    fn admit(&self, stream: &TcpStream) -> Option<u64> {
        let handle = stream.try_clone().ok()?;
        let mut connections = self.connections();
        if connections.list.len() >= MAX_THREADS {
            return None;
        }
        if connections.list.iter().filter(|c| !c.closed).count() >= MAX_CONNECTIONS {
            let now = Instant::now();
            let oldest = connections.list.iter_mut().filter(|c| !c.closed && c.evictable_from <= now).min_by_key(|c| c.evictable_from)?;
            // Wakes its thread, blocked reading: the read ends and so does the thread.
            let _ = oldest.stream.shutdown(Shutdown::Both);
            oldest.closed = true;
        }
        let id = connections.next_id;
        connections.next_id += 1;
        connections.list.push(Connection { id, stream: handle, evictable_from: Instant::now(), closed: false });
        Some(id)
    }

    fn set_idle(&self, id: u64, idle: bool) {
        if let Some(c) = self.connections().list.iter_mut().find(|c| c.id == id) {
            c.evictable_from = if idle { Instant::now() } else { Instant::now() + SLOW_RESPONSE };
        }
    }

    fn leave(&self, id: u64) {
        self.connections().list.retain(|c| c.id != id);
    }
}

/// A connection's place in the list, given back when its thread ends (a panic included).
struct Place<'a> {
    site: &'a Site,
    id: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.site.leave(self.id);
    }
}

/// Runs the server until the process is killed. Errors are for start-up only (bad FILE, no page,
/// cannot listen).
/// When the server stops other than by being killed.
#[derive(Debug, Clone, Copy, Default)]
pub struct End {
    /// When stdin ends (the parent that holds its other end is gone).
    pub until_stdin_ends: bool,
    /// Then the snapshot, a temporary copy, is removed.
    pub remove_file_at_end: bool,
}

pub fn run(file: Option<&Path>, host: &str, port: u16, root: Option<&Path>, end: End) -> Result<(), String> {
    let snapshot = file.map(snapshot_route).transpose()?;
    let root = find_root(root)?;
    let listener = TcpListener::bind((host, port)).map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    let mut url = format!("http://{}/", display_addr(addr));
    if let Some((path, _)) = &snapshot {
        url.push_str("?file=");
        url.push_str(&percent_encode(path));
    }
    // A closed stdout must not stop the server: the URL is a courtesy to whoever started it.
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "tensormem: serving {url}").and_then(|()| out.flush());
    drop(out);
    if end.until_stdin_ends {
        let remove = end.remove_file_at_end.then(|| file.map(Path::to_path_buf)).flatten();
        std::thread::spawn(move || {
            // Nothing is ever written to it: it ends when the parent closes it or dies.
            let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
            if let Some(path) = remove {
                let _ = std::fs::remove_file(path);
            }
            std::process::exit(0);
        });
    }

    let site = Arc::new(Site { root, snapshot, loopback: addr.ip().is_loopback(), connections: Mutex::default() });
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let Some(id) = site.admit(&stream) else {
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = send(&stream, false, Reply::Error(503));
                    continue;
                };
                let for_thread = Arc::clone(&site);
                let spawned = std::thread::Builder::new().name("tensormem-serve".into()).spawn(move || {
                    let place = Place { site: &for_thread, id };
                    if let Err(e) = handle(&place, &stream)
                        && !is_disconnect(&e)
                    {
                        eprintln!("tensormem serve: connection error: {e}");
                    }
                });
                if let Err(e) = spawned {
                    eprintln!("tensormem serve: cannot start a connection thread: {e}");
                    site.leave(id);
                }
            }
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                eprintln!("tensormem serve: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(())
}

/// The page's files shipped with the Python package, when this runs from it.
static PACKAGED_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Serves the page from `root` when no `--root` is given (the Python package's copy).
pub fn set_packaged_root(root: PathBuf) {
    let _ = PACKAGED_ROOT.set(root);
}

/// The canonical web root: `--root`, else the packaged page (Python), else `www` in the current
/// directory, else the workspace's `www` next to this package. It must hold an index.html.
fn find_root(root: Option<&Path>) -> Result<PathBuf, String> {
    let chosen = match root {
        Some(r) => r.to_path_buf(),
        None => {
            let packaged = PACKAGED_ROOT.get().cloned();
            let candidates: Vec<PathBuf> = packaged.into_iter().chain([PathBuf::from("www"), Path::new(env!("CARGO_MANIFEST_DIR")).join("../www")]).collect();
            // The first with a page, else the first that exists (for the error message).
            let with_page = candidates.iter().find(|c| c.join("index.html").is_file());
            let existing = candidates.iter().find(|c| c.is_dir());
            with_page.or(existing).unwrap_or(&candidates[candidates.len() - 1]).clone()
        }
    };
    let build_hint = "build the page first with `bash scripts/run.sh` (or pass --root DIR)";
    let canonical = chosen.canonicalize().map_err(|e| format!("web page folder {} not found ({e}): {build_hint}", chosen.display()))?;
    if !canonical.join("index.html").is_file() {
        return Err(format!("no index.html in {}: {build_hint}", canonical.display()));
    }
    Ok(canonical)
}

/// Checks that FILE can be served and returns its URL path (`/snapshot/<basename>`, decoded) and
/// canonical path.
fn snapshot_route(file: &Path) -> Result<(Vec<u8>, PathBuf), String> {
    // The type first, from the name: opening a named pipe would wait for a writer.
    let meta = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file (the page reads the snapshot each time it opens: save it to a file)", file.display()));
    }
    File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let canonical = file.canonicalize().map_err(|e| format!("{}: {e}", file.display()))?;
    let name = canonical.file_name().ok_or_else(|| format!("{}: no file name", file.display()))?;
    let mut path = b"/snapshot/".to_vec();
    path.extend_from_slice(name.as_encoded_bytes());
    Ok((path, canonical))
}

/// `0.0.0.0` and `::` are not addresses a browser should be sent to: print loopback instead.
fn display_addr(addr: SocketAddr) -> String {
    let mut shown = addr;
    if addr.ip().is_unspecified() {
        shown.set_ip(match addr {
            SocketAddr::V4(_) => [127, 0, 0, 1].into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    shown.to_string()
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::TimedOut
            | io::ErrorKind::WouldBlock
    )
}

/// A response decided from the request: status, content type and what to send as the body.
enum Reply {
    File { file: File, len: u64, mime: &'static str },
    Error(u16),
}

/// Serves one request on `stream`, then closes it.
fn handle(place: &Place, stream: &TcpStream) -> io::Result<()> {
    let site = place.site;
    stream.set_write_timeout(Some(Duration::from_secs(60)))?;
    let deadline = Deadline { stream, until: Instant::now() + HEAD_DEADLINE };
    let mut reader = BufReader::new(deadline.take(MAX_HEAD));
    let request = read_request(&mut reader)?;
    site.set_idle(place.id, false);
    let (head_only, reply) = match request {
        Ok(Request { method, target, host }) => {
            let head_only = method == "HEAD";
            let reply = if site.loopback && !host.as_deref().is_none_or(names_this_machine) {
                Reply::Error(421)
            } else if method != "GET" && !head_only {
                Reply::Error(405)
            } else {
                route(site, &target)
            };
            (head_only, reply)
        }
        Err(status) => (false, Reply::Error(status)),
    };
    send(stream, head_only, reply)?;
    // Close gracefully: stop writing, then drain what the client still sends (a body we did not
    // read) so the kernel does not answer it with a reset that could discard our response. This
    // waits on the client: idle again.
    site.set_idle(place.id, true);
    let _ = stream.shutdown(Shutdown::Write);
    let mut rest = Deadline { stream, until: Instant::now() + DRAIN_DEADLINE };
    let _ = io::copy(&mut (&mut rest).take(1 << 20), &mut io::sink());
    Ok(())
}

/// A stream whose reads fail once the deadline has passed, however slowly the bytes trickle in.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "request head too slow"));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// `Host: 127.0.0.1:8080`, `localhost`, `[::1]:8080`: a name for this machine (any port).
fn names_this_machine(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// What the server needs of a request head.
struct Request {
    method: String,
    target: String,
    /// The Host header's value; only HTTP/1.0 may leave it out.
    host: Option<String>,
}

/// Reads the request line and the headers. `Ok(Err(status))` is a malformed request.
fn read_request<R: BufRead>(reader: &mut R) -> io::Result<Result<Request, u16>> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\n") {
        // Closed early or too long.
        return Ok(Err(if line.is_empty() { 400 } else { 431 }));
    }
    let Ok(request_line) = std::str::from_utf8(&line) else {
        return Ok(Err(400));
    };
    let mut parts = request_line.split_ascii_whitespace();
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Ok(Err(400));
    };
    let http_1_0 = match version.as_bytes() {
        b"HTTP/1.0" => true,
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', minor] if minor.is_ascii_digit() => false,
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor] if major.is_ascii_digit() && minor.is_ascii_digit() => return Ok(Err(505)),
        _ => return Ok(Err(400)),
    };
    let (method, target) = (method.to_string(), target.to_string());
    let (mut host, mut hosts) = (None, 0);
    loop {
        let mut line = Vec::new();
        reader.read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\n") {
            // Closed before the blank line, or headers too long.
            return Ok(Err(if line.is_empty() { 400 } else { 431 }));
        }
        let line = &line[..line.len() - 1];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        // `name: value`, the name a token right before the colon (RFC 9112 5.1). This also
        // refuses folded lines (5.2), which start with whitespace.
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Ok(Err(400));
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.is_empty() || !name.iter().all(|&b| is_token_byte(b)) {
            return Ok(Err(400));
        }
        if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
            host = std::str::from_utf8(value).ok().map(str::to_string);
        }
    }
    // RFC 9112 3.2: one valid Host at most, and HTTP/1.1 requires it.
    let valid = match hosts {
        0 => http_1_0,
        1 => host.is_some(),
        _ => false,
    };
    Ok(if valid { Ok(Request { method, target, host }) } else { Err(400) })
}

/// RFC 9110 5.6.2: the bytes a header name may use.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Maps a request target to a file inside the root (or the snapshot), or to an error status.
fn route(site: &Site, target: &str) -> Reply {
    if !target.starts_with('/') {
        return Reply::Error(400);
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    let Some(decoded) = percent_decode(path.as_bytes()) else {
        return Reply::Error(400);
    };
    if let Some((snapshot_path, file)) = &site.snapshot
        && decoded == *snapshot_path
    {
        return open(file, "application/octet-stream");
    }
    match resolve(&site.root, &decoded) {
        Some(file) => {
            let mime = mime_type(&file);
            open(&file, mime)
        }
        None => Reply::Error(404),
    }
}

/// The canonical file under `root` that a decoded URL path names, if it is safe to serve.
fn resolve(root: &Path, decoded: &[u8]) -> Option<PathBuf> {
    if decoded.contains(&0) || decoded.contains(&b'\\') {
        return None;
    }
    let text = std::str::from_utf8(decoded).ok()?;
    let mut relative = PathBuf::new();
    for segment in text.split('/').filter(|s| !s.is_empty() && *s != ".") {
        let mut components = Path::new(segment).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(c)), None) if c == OsStr::new(segment) => relative.push(c),
            _ => return None, // `..`, a drive or root prefix, or anything else odd.
        }
    }
    let mut candidate = root.join(&relative);
    if candidate.is_dir() {
        candidate.push("index.html");
    }
    let canonical = candidate.canonicalize().ok()?;
    (canonical.starts_with(root) && canonical.is_file()).then_some(canonical)
}

fn open(path: &Path, mime: &'static str) -> Reply {
    // Only regular files, checked before opening (a pipe put in a file's place would block).
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Reply::Error(404);
    }
    let Ok(file) = File::open(path) else {
        return Reply::Error(404);
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() => Reply::File { file, len: meta.len(), mime },
        _ => Reply::Error(404),
    }
}

fn send(mut stream: &TcpStream, head_only: bool, reply: Reply) -> io::Result<()> {
    let (status, mime, len, file) = match reply {
        Reply::File { file, len, mime } => (200, mime, len, Some(file)),
        Reply::Error(status) => (status, "text/plain; charset=utf-8", reason(status).len() as u64 + 1, None),
    };
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {mime}\r\nContent-Length: {len}\r\n\
         Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
        reason(status)
    );
    if status == 405 {
        head.push_str("Allow: GET, HEAD\r\n");
    }
    head.push_str("\r\n");
    if !head_only && file.is_none() {
        head.push_str(reason(status));
        head.push('\n');
    }
    stream.write_all(head.as_bytes())?;
    if let (false, Some(file)) = (head_only, file) {
        // At most the announced length, even if the file grew meanwhile.
        io::copy(&mut file.take(len), &mut stream)?;
    }
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

fn mime_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(OsStr::to_str).map(str::to_ascii_lowercase).unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "wasm" => "application/wasm",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream", // .pickle, .pkl and the rest
    }
}

/// `%XX` escapes to bytes; `None` for a malformed escape.
fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Escapes every byte but RFC 3986's unreserved characters and `/`.
fn percent_encode(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_and_encode() {
        assert_eq!(percent_decode(b"/a%20b").unwrap(), b"/a b");
        assert_eq!(percent_decode(b"/%2e%2E/x").unwrap(), b"/../x");
        assert!(percent_decode(b"/%2").is_none());
        assert!(percent_decode(b"/%zz").is_none());
        assert!(percent_decode(b"/%+1").is_none());
        assert_eq!(percent_encode(b"/snapshot/my snap#1.pickle"), "/snapshot/my%20snap%231.pickle");
    }

    #[test]
    fn request_heads() {
        let status = |raw: &[u8]| match read_request(&mut &raw[..]).unwrap() {
            Ok(_) => 200,
            Err(status) => status,
        };
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
        assert_eq!(status(b"GET / HTTP/1.0\r\n\r\n"), 200);
        assert_eq!(status(b"GET / HTTP/1.2\r\nHost: x\r\n\r\n"), 200);
        assert_eq!(status(b"GET / HTTP/2.0\r\n\r\n"), 505);
        for bad in [&b"GET / HTTP/1.1x\r\n\r\n"[..], b"GET / HTTP/1\r\n\r\n", b"GET / http/1.1\r\nHost: x\r\n\r\n"] {
            assert_eq!(status(bad), 400, "{}", String::from_utf8_lossy(bad));
        }
        // A Host that is not text is no valid Host.
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n"), 400);
        // Other headers may carry such bytes (obs-text).
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: x\r\nX-Name: caf\xe9\r\n\r\n"), 200);
        // Cut short before the blank line.
        assert_eq!(status(b"GET / HTTP/1.1\r\nHost: x\r\n"), 400);
    }

    #[test]
    fn mime_types() {
        assert_eq!(mime_type(Path::new("a/b.WASM")), "application/wasm");
        assert_eq!(mime_type(Path::new("x.mjs")), "text/javascript; charset=utf-8");
        assert_eq!(mime_type(Path::new("x.pkl")), "application/octet-stream");
        assert_eq!(mime_type(Path::new("Makefile")), "application/octet-stream");
    }
}
