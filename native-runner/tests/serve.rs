//! `tensormem serve` as a browser or a script meets it: the printed URL, status codes, content
//! types, traversal attempts, the snapshot route, malformed requests, idle connections and
//! start-up errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SECRET: &str = "top-secret-do-not-serve";
const INDEX: &str = "<!doctype html><title>tensormem</title>";

/// A scratch folder removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("tensormem-serve-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// `root/` with index.html, app.js and x.wasm, and a secret file next to it (outside).
    fn site(name: &str) -> TempDir {
        let dir = TempDir::new(name);
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("pkg")).unwrap();
        std::fs::write(root.join("index.html"), INDEX).unwrap();
        std::fs::write(root.join("app.js"), "console.log(1);\n").unwrap();
        std::fs::write(root.join("x.wasm"), b"\0asm\x01\0\0\0").unwrap();
        std::fs::write(root.join("pkg/style.css"), "body {}\n").unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        dir
    }

    fn root(&self) -> PathBuf {
        self.path().join("root")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `tensormem serve`, killed on drop.
struct Server {
    child: Child,
    url: String,
    /// host:port to connect to.
    addr: String,
}

impl Server {
    fn start(args: &[&str], cwd: Option<&Path>) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tensormem"));
        command.arg("serve").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(dir) = cwd {
            command.current_dir(dir);
        }
        let mut child = command.spawn().expect("the binary runs");
        let stdout = child.stdout.take().unwrap();
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = send.send(line);
        });
        let mut server = Server { child, url: String::new(), addr: String::new() };
        let line = receive.recv_timeout(Duration::from_secs(60)).expect("the server prints its URL");
        let line = line.trim_end().to_string();
        let url = line.strip_prefix("tensormem: serving ").unwrap_or_else(|| panic!("unexpected first line {line:?}: {}", server.stderr()));
        let rest = url.strip_prefix("http://127.0.0.1:").expect("a loopback URL");
        let port: u16 = rest.split('/').next().unwrap().parse().expect("a port");
        assert_ne!(port, 0);
        server.url = url.to_string();
        server.addr = format!("127.0.0.1:{port}");
        server
    }

    /// Kills the server and returns what it wrote to stderr.
    fn stderr(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut text = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = ChildStderr::read_to_string(&mut e, &mut text);
        }
        text
    }

    /// Sends `raw` as the whole request and reads the response until the server closes.
    fn raw(&self, raw: &[u8]) -> Response {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream.write_all(raw).unwrap();
        let mut bytes = Vec::new();
        stream.read_to_end(&mut bytes).unwrap();
        Response::parse(&bytes)
    }

    fn get(&self, target: &str) -> Response {
        self.raw(format!("GET {target} HTTP/1.1\r\nHost: {}\r\n\r\n", self.addr).as_bytes())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Response {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Response {
    fn parse(bytes: &[u8]) -> Response {
        let split = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(bytes)));
        let head = String::from_utf8(bytes[..split].to_vec()).unwrap();
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad status line in {head:?}"));
        assert!(head.starts_with("HTTP/1.1 "), "{head}");
        Response { status, head, body: bytes[split + 4..].to_vec() }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn tensormem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensormem")).args(args).stdin(Stdio::null()).output().expect("the binary runs")
}

fn root_arg(site: &TempDir) -> String {
    site.root().to_str().unwrap().to_string()
}

#[test]
fn serves_the_page_with_types_and_headers() {
    let site = TempDir::site("page");
    let server = Server::start(&["--port", "0", "--root", &root_arg(&site)], None);
    assert!(server.url.ends_with('/') && !server.url.contains('?'), "{}", server.url);

    let r = server.get("/");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.text(), INDEX);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("content-length"), Some(INDEX.len().to_string().as_str()));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("connection"), Some("close"));

    let r = server.get("/index.html?file=/snapshot/x.pickle#top");
    assert_eq!((r.status, r.text()), (200, INDEX.to_string()));

    let r = server.get("/x.wasm");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/wasm"));
    assert_eq!(r.body, b"\0asm\x01\0\0\0");

    let r = server.get("/app.js");
    assert_eq!(r.header("content-type"), Some("text/javascript; charset=utf-8"));
    let r = server.get("/pkg/style.css");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/css; charset=utf-8"));
    let r = server.get("/pkg/");
    assert_eq!(r.status, 404, "a folder without index.html");

    // HTTP/1.0 and HEAD.
    let r = server.raw(b"GET /app.js HTTP/1.0\r\n\r\n");
    assert_eq!((r.status, r.text().as_str()), (200, "console.log(1);\n"));
    let r = server.raw(b"HEAD / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some(INDEX.len().to_string().as_str()));
    assert!(r.body.is_empty());

    let r = server.get("/missing.js");
    assert_eq!(r.status, 404);
    let r = server.raw(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    let r = server.raw(b"DELETE /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(r.status, 405);
    let r = server.raw(b"nonsense\r\n\r\n");
    assert_eq!(r.status, 400);
}

#[test]
fn never_serves_files_outside_the_root() {
    let site = TempDir::site("traversal");
    #[cfg(unix)]
    std::os::unix::fs::symlink(site.path().join("secret"), site.root().join("link")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(site.path(), site.root().join("up")).unwrap();
    let server = Server::start(&["--port", "0", "--root", &root_arg(&site)], None);
    let secret = site.path().join("secret");
    let absolute = secret.to_str().unwrap();
    for target in [
        "/../secret",
        "/%2e%2e/secret",
        "/%2E%2E/secret",
        "/a/..%2fsecret",
        "/a/..%2f..%2fsecret",
        "/..%2fsecret",
        "/%2e%2e%2fsecret",
        "/..%5csecret",
        "/..\\secret",
        "/./../secret",
        "/pkg/../../secret",
        "/%00/../secret",
        "/index.html%00",
        &format!("/{absolute}"),
        &format!("/%2f{}", absolute.trim_start_matches('/')),
        "/link",
        "/up/secret",
        "//etc/passwd",
        "/%",
        "/%zz",
        "/%+1",
    ] {
        let r = server.get(target);
        assert!(r.status == 404 || r.status == 400, "{target}: {}", r.head);
        assert!(!r.text().contains(SECRET), "{target} leaked the secret");
    }
    // Absolute-form and asterisk-form targets are refused as well.
    for target in ["http://example.com/../secret", "*", "secret"] {
        let r = server.get(target);
        assert_eq!(r.status, 400, "{target}");
    }
    // Still serving afterwards.
    assert_eq!(server.get("/").status, 200);
}

#[test]
fn serves_the_snapshot_file_at_its_route() {
    let site = TempDir::site("snapshot");
    let snapshot = site.path().join("my snap#1.pickle");
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&snapshot, &bytes).unwrap();
    let server = Server::start(&[snapshot.to_str().unwrap(), "--port", "0", "--root", &root_arg(&site)], None);
    let (_, query) = server.url.split_once('?').expect("a query in the URL");
    assert_eq!(query, "file=/snapshot/my%20snap%231.pickle");

    let r = server.get("/snapshot/my%20snap%231.pickle");
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.header("content-length"), Some("100000"));
    assert!(r.body == bytes, "the snapshot's bytes");

    // A page on another site that rebinds its name to 127.0.0.1 still names itself in Host: it
    // gets nothing. Names of this machine, with or without a port, are served.
    for host in ["evil.example", "evil.example:8080", "192.168.1.10"] {
        let r = server.raw(format!("GET /snapshot/my%20snap%231.pickle HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        assert_eq!(r.status, 421, "{host}: {}", r.head);
        assert!(r.body.len() < 1000, "{host}: no snapshot bytes");
    }
    for host in ["localhost", "LOCALHOST:1234", "127.0.0.1", "[::1]:8080"] {
        let r = server.raw(format!("GET /snapshot/my%20snap%231.pickle HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
        assert_eq!(r.status, 200, "{host}: {}", r.head);
    }

    // Only that exact path maps to the file.
    for target in ["/snapshot/", "/snapshot/other.pickle", "/snapshot/my%20snap%231.pickle/", "/snapshot/../my%20snap%231.pickle", "/my%20snap%231.pickle"] {
        assert_eq!(server.get(target).status, 404, "{target}");
    }
    assert_eq!(server.get("/").status, 200);
}

#[test]
fn a_client_leaving_mid_response_does_not_stop_the_server() {
    let site = TempDir::site("disconnect");
    let big = vec![7u8; 32 << 20];
    std::fs::write(site.root().join("big.pickle"), &big).unwrap();
    let mut server = Server::start(&["--port", "0", "--root", &root_arg(&site)], None);
    for _ in 0..5 {
        let mut stream = TcpStream::connect(&server.addr).unwrap();
        stream.write_all(b"GET /big.pickle HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        let mut some = [0u8; 4096];
        let _ = stream.read(&mut some).unwrap();
        drop(stream);
    }
    // A client that connects and says nothing, then leaves.
    drop(TcpStream::connect(&server.addr).unwrap());
    let r = server.get("/big.pickle");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), big.len());
    assert_eq!(server.get("/").status, 200);
    let stderr = server.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_header_line_without_a_colon_is_a_bad_request() {
    let site = TempDir::site("no-colon");
    let server = Server::start(&["--port", "0", "--root", &root_arg(&site)], None);
    for raw in [
        "GET / HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n",
        "GET / HTTP/1.1\r\nnocolon\r\nHost: localhost\r\n\r\n",
        "GET / HTTP/1.0\r\nbroken\r\n\r\n",
        // RFC 9112 5.1: no whitespace between the name and the colon; 5.2: no line folding.
        "GET / HTTP/1.1\r\nHost : localhost\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: localhost\r\nAccept: text/html,\r\n text/plain\r\n\r\n",
        "GET / HTTP/1.1\r\n: no name\r\nHost: localhost\r\n\r\n",
    ] {
        let r = server.raw(raw.as_bytes());
        assert_eq!(r.status, 400, "{raw:?}: {}", r.head);
        assert!(!r.text().contains(INDEX), "{raw:?}");
    }
    // Well-formed heads in odd but valid spellings are still served.
    for raw in ["GET / HTTP/1.1\r\nhOsT:localhost\r\nX-Empty:\r\n\r\n", "GET / HTTP/1.1\nHost: localhost\nAccept: */*\n\n"] {
        let r = server.raw(raw.as_bytes());
        assert_eq!((r.status, r.text().as_str()), (200, INDEX), "{raw:?}");
    }
}

#[test]
fn http_1_1_without_one_host_is_a_bad_request() {
    let site = TempDir::site("no-host");
    let server = Server::start(&["--port", "0", "--root", &root_arg(&site)], None);
    // RFC 9112 3.2: an HTTP/1.1 request needs exactly one Host header.
    for raw in [
        "GET / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
        "HEAD / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: evil.example\r\nHost: localhost\r\n\r\n",
    ] {
        let r = server.raw(raw.as_bytes());
        assert_eq!(r.status, 400, "{raw:?}: {}", r.head);
        assert!(!r.text().contains(INDEX), "{raw:?}");
    }
    // HTTP/1.0 predates Host: it may leave it out.
    let r = server.raw(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!((r.status, r.text().as_str()), (200, INDEX));
    let r = server.raw(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert_eq!(r.status, 200);
}

#[test]
fn idle_connections_do_not_starve_requests() {
    let site = TempDir::site("idle");
    let mut server = Server::start(&["--port", "0", "--root", &root_arg(&site)], None);
    // More idle sockets than the server has room for (64): some send nothing, some a partial
    // request head, all stay open.
    let mut idle = Vec::new();
    for i in 0..100 {
        let mut stream = TcpStream::connect(&server.addr).unwrap();
        if i % 2 == 1 {
            stream.write_all(b"GET / HTTP/1.1\r\nHost: local").unwrap();
        }
        idle.push(stream);
    }
    // Real requests are still answered, at once (well before any idle deadline of the server).
    for _ in 0..3 {
        let start = Instant::now();
        let r = server.get("/");
        assert_eq!((r.status, r.text().as_str()), (200, INDEX), "{}", r.head);
        assert!(start.elapsed() < Duration::from_secs(5), "answered after {:?}", start.elapsed());
    }
    // And again after a second wave of idle sockets (few enough that the server never waits for
    // the threads of the sockets it closed, however slowly they end).
    for _ in 0..20 {
        idle.push(TcpStream::connect(&server.addr).unwrap());
    }
    let r = server.get("/app.js");
    assert_eq!(r.status, 200, "{}", r.head);
    drop(idle);
    assert_eq!(server.get("/").status, 200);
    let stderr = server.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn default_root_is_www_in_the_current_directory() {
    let dir = TempDir::new("cwd");
    std::fs::create_dir_all(dir.path().join("www")).unwrap();
    std::fs::write(dir.path().join("www/index.html"), "from cwd").unwrap();
    let server = Server::start(&["--port", "0"], Some(dir.path()));
    let r = server.get("/");
    assert_eq!((r.status, r.text().as_str()), (200, "from cwd"));
}

#[test]
fn a_missing_snapshot_is_a_clear_error() {
    let site = TempDir::site("missing-file");
    let missing = site.path().join("nope.pickle");
    let out = tensormem(&["serve", missing.to_str().unwrap(), "--port", "0", "--root", &root_arg(&site)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nope.pickle"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "no URL printed");

    // A folder is not a snapshot either.
    let out = tensormem(&["serve", site.root().to_str().unwrap(), "--port", "0", "--root", &root_arg(&site)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn a_root_without_the_page_says_how_to_build_it() {
    let dir = TempDir::new("no-index");
    for root in [dir.path().to_path_buf(), dir.path().join("absent")] {
        let out = tensormem(&["serve", "--port", "0", "--root", root.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("scripts/run.sh"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(out.stdout.is_empty());
    }
}
