//! `tensormem mcp`: a Model Context Protocol server on stdin and stdout, so that an assistant can
//! read a user's snapshot with the same commands a user types.
//!
//! MCP over stdio is JSON-RPC 2.0, one message a line. Written by hand on serde_json: the
//! official SDK (`rmcp`, with tokio, futures, schemars and a second `syn`) added about 50 crates,
//! two minutes of clean build on two cores and 3.3 MB of binary for five tools and four methods.
//!
//! Each tool runs the function its subcommand runs and returns what its `--json` prints (one JSON
//! object a line); a failure is a tool result with `isError` and the line the CLI prints. Tools
//! read the files they are given and write nothing (a GPU run keeps its matmul measurements in
//! memory). Each call runs in a process of its own, so calls run side by side, a cancel stops
//! one, and no input ends the server but the end of its input (exit 0, once the calls running
//! have answered).
//!
//! This file is the transport (messages, the process per call, cancels); `tools.rs` is the
//! catalogue and how a call's arguments become a subcommand's.

mod tools;

use crate::Failure;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use tools::{call, call_tool, tools};

/// The protocol revisions this server speaks (tools only: the same in each); the newest is offered
/// to a client that asks for another.
const PROTOCOL_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;

/// The longest message read (a request names files and settings: kilobytes). A longer line is
/// skipped, not buffered, and answered with an error.
const MAX_MESSAGE: usize = 16 << 20;

/// Where a tool call's answer is written: replies from calls running side by side, whole lines.
type Output = Arc<Mutex<std::io::Stdout>>;

/// Tool calls running, by request id (its JSON text): the process doing each.
type Running = Arc<Mutex<HashMap<String, Child>>>;

/// Serves requests from stdin until it ends, then waits for the calls still running.
///
/// Each `tools/call` runs in a process of its own (this binary, `mcp --call`), so the server
/// answers other requests meanwhile, `notifications/cancelled` stops a call by ending its
/// process, and a call that fails hard (out of memory, a stack overflow) fails alone.
pub fn serve() -> Result<(), Failure> {
    // A call's process that dies before reading its request must not take the server with it:
    // a write to a closed pipe is an error here, not a signal.
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition before this server starts any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let mut stdin = std::io::BufReader::new(std::io::stdin().lock());
    let out: Output = Arc::new(Mutex::new(std::io::stdout()));
    let running: Running = Arc::default();
    let most = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let mut calls: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let outcome = loop {
        let reply = match read_message(&mut stdin) {
            Err(e) => break Err(e),
            Ok(Message::End) => break Ok(()),
            Ok(Message::TooLong) => {
                Some(error_reply(Value::Null, INVALID_REQUEST, format!("invalid request: a message longer than {} MiB", MAX_MESSAGE >> 20)))
            }
            Ok(Message::NotText) => Some(error_reply(Value::Null, PARSE_ERROR, "parse error: the line is not UTF-8".into())),
            Ok(Message::Line(line)) if line.trim().is_empty() => None,
            Ok(Message::Line(line)) => match tool_call(&line) {
                Some(id) => {
                    calls.retain(|c| !c.is_finished());
                    let key = id.to_string();
                    if running.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&key) {
                        Some(error_reply(id, INVALID_REQUEST, format!("invalid request: id {key} is used by a call still running")))
                    } else if calls.len() >= most {
                        Some(error_reply(
                            id,
                            INVALID_REQUEST,
                            format!("{most} tool calls are running, the most at once here: wait for one to end or cancel one"),
                        ))
                    } else {
                        match start_call(id.clone(), line, out.clone(), running.clone()) {
                            Ok(call) => {
                                calls.push(call);
                                None
                            }
                            Err(e) => Some(error_reply(id, INTERNAL_ERROR, format!("cannot start the tool call: {e}"))),
                        }
                    }
                }
                None => {
                    cancel_if_asked(&line, &running);
                    handle(&line)
                }
            },
        };
        if let Some(reply) = reply
            && let Err(e) = write_reply(&out, &reply)
        {
            break Err(e);
        }
    };
    // The calls still running answer before the server ends, unless nobody can read their
    // answers: the server cannot write any more, or the client closed its end of stdout.
    let end_calls = || {
        for (_, mut child) in running.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            let _ = child.kill();
            let _ = child.wait();
        }
    };
    if outcome.is_err() {
        end_calls();
    }
    while calls.iter().any(|c| !c.is_finished()) {
        if output_closed() {
            end_calls();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for call in calls {
        let _ = call.join();
    }
    outcome
}

/// Whether stdout is a pipe whose reader has gone (a client that closed it): answers written
/// now would go nowhere.
fn output_closed() -> bool {
    #[cfg(unix)]
    {
        let mut poll = libc::pollfd { fd: libc::STDOUT_FILENO, events: 0, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        ready > 0 && poll.revents & (libc::POLLERR | libc::POLLHUP) != 0
    }
    #[cfg(not(unix))]
    false
}

/// One line of input.
enum Message {
    Line(String),
    NotText,
    TooLong,
    End,
}

/// The next line, read at most [`MAX_MESSAGE`] bytes at a time: a longer one is skipped to its end.
fn read_message(input: &mut impl BufRead) -> Result<Message, Failure> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Message::TooLong,
                (false, true) => Message::End,
                (false, false) => text(line),
            });
        }
        let (chunk, ends) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (&available[..at], Some(at + 1)),
            None => (available, None),
        };
        if !too_long && line.len() + chunk.len() <= MAX_MESSAGE {
            line.extend_from_slice(chunk);
        } else {
            too_long = true;
            line = Vec::new();
        }
        let used = ends.unwrap_or(available.len());
        input.consume(used);
        if ends.is_some() {
            return Ok(if too_long { Message::TooLong } else { text(line) });
        }
    }
}

fn text(line: Vec<u8>) -> Message {
    String::from_utf8(line).map_or(Message::NotText, Message::Line)
}

fn write_reply(out: &Output, reply: &Value) -> Result<(), Failure> {
    let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
    writeln!(out, "{reply}")?;
    out.flush()?;
    Ok(())
}

/// A `tools/call` request's id (a string or a number, as MCP requires); None for any other
/// message (or a malformed one, which [`handle`] answers).
fn tool_call(line: &str) -> Option<Value> {
    let message: Value = serde_json::from_str(line).ok()?;
    let id = message.get("id").filter(|id| id.is_string() || is_whole(id))?.clone();
    (message.get("method")? == "tools/call").then_some(id)
}

/// An id number this server can echo exactly: a whole number of at most 64 bits (a larger one
/// or a fraction would come back as a float the client could not match).
fn is_whole(id: &Value) -> bool {
    id.is_i64() || id.is_u64()
}

/// `notifications/cancelled`: ends the named call's process; the call gets no answer, as the
/// protocol asks.
fn cancel_if_asked(line: &str, running: &Running) {
    let Ok(message) = serde_json::from_str::<Value>(line) else { return };
    if message.get("method").and_then(Value::as_str) != Some("notifications/cancelled") {
        return;
    }
    let Some(id) = message.pointer("/params/requestId") else { return };
    let child = running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id.to_string());
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Runs one tool call (its whole request line) in a process of its own, started here so that
/// a cancel read next finds it, and answers it from a thread when the process ends, unless it
/// was cancelled.
fn start_call(id: Value, request: String, out: Output, running: Running) -> std::io::Result<std::thread::JoinHandle<()>> {
    let key = id.to_string();
    let mut child = spawn_call()?;
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    running.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), child);
    let answer = move || {
        let errors = std::thread::spawn(move || read_tail(stderr, 8 << 10));
        let reader = std::thread::spawn(move || read_tail(stdout, usize::MAX));
        // The readers run first: a process that writes before reading all cannot block.
        if let Some(mut stdin) = stdin {
            let _ = stdin.write_all(request.as_bytes());
        }
        let answer = reader.join().unwrap_or_default();
        let errors = errors.join().unwrap_or_default();
        // Gone from the table: cancelled, and answered by nobody.
        let child = running.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        if let Some(mut child) = child {
            let status = child.wait().ok();
            let _ = write_reply(&out, &call_reply(id, &answer, &errors, status));
        }
    };
    std::thread::Builder::new().name("mcp call".into()).spawn(answer)
}

fn spawn_call() -> std::io::Result<Child> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["mcp", "--call"])
        // The tools write nothing: a GPU run keeps its matmul measurements in memory.
        .env("TENSORMEM_CACHE", "memory")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; it asks the kernel to end the call with the server.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    command.spawn()
}

/// What a pipe gives until it closes, keeping at most its last `keep` bytes (a call's stderr
/// is read for its last line only).
fn read_tail(pipe: Option<impl Read>, keep: usize) -> String {
    let mut kept = Vec::new();
    if let Some(mut pipe) = pipe {
        let mut chunk = [0u8; 64 << 10];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => kept.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            if kept.len() > keep {
                kept.drain(..kept.len() - keep);
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// The answer to a call from its process's output: the JSON-RPC reply it printed, or, when it
/// ended without one, a tool error saying how it ended.
fn call_reply(id: Value, answer: &str, errors: &str, status: Option<std::process::ExitStatus>) -> Value {
    match serde_json::from_str::<Value>(answer.trim()) {
        Ok(Value::Object(mut reply)) => {
            reply.insert("jsonrpc".into(), json!("2.0"));
            reply.insert("id".into(), id);
            Value::Object(reply)
        }
        _ => {
            let how = status.map_or("ended".to_string(), |s| format!("ended ({s})"));
            let last = errors.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
            let text = format!("error: the tool call {how} without an answer: {last}");
            json!({ "jsonrpc": "2.0", "id": id, "result": { "content": [{ "type": "text", "text": text }], "isError": true } })
        }
    }
}

/// `tensormem mcp --call`: one tool call, its request line on stdin, its reply (without `jsonrpc`
/// and `id`, which the server adds) on stdout.
pub fn call_from_stdin() -> Result<(), Failure> {
    let mut text = String::new();
    std::io::stdin().lock().take(MAX_MESSAGE as u64 + 1).read_to_string(&mut text)?;
    let request: Value = serde_json::from_str(&text).map_err(|e| Failure(format!("tool call: {e}"), 2))?;
    let reply = match call(request.get("params").unwrap_or(&Value::Null)) {
        Ok(result) => json!({ "result": result }),
        Err((code, message)) => json!({ "error": { "code": code, "message": message } }),
    };
    println!("{reply}");
    Ok(())
}

/// The reply to one line, or none for a notification (or a response: this server asks nothing).
fn handle(line: &str) -> Option<Value> {
    let message: Value = match serde_json::from_str(line) {
        Ok(m) => m,
        Err(e) => return Some(error_reply(Value::Null, PARSE_ERROR, format!("parse error: {e}"))),
    };
    let Some(message) = message.as_object() else {
        return Some(error_reply(Value::Null, INVALID_REQUEST, "invalid request: expected a JSON-RPC message object".into()));
    };
    let id = message.get("id").cloned();
    if id.as_ref().is_some_and(|id| id.is_number() && !is_whole(id)) {
        let text = "invalid request: an id must be a string or a whole number of at most 64 bits (this one could not be echoed exactly)";
        return Some(error_reply(Value::Null, INVALID_REQUEST, text.into()));
    }
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        let is_response = message.contains_key("result") || message.contains_key("error");
        return (!is_response).then(|| error_reply(id.unwrap_or(Value::Null), INVALID_REQUEST, "invalid request: no method".into()));
    };
    // Notifications (`notifications/initialized`, `notifications/cancelled`) need no answer.
    let id = id?;
    let params = message.get("params").unwrap_or(&Value::Null);
    let result = match method {
        "initialize" => Ok(initialize(params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": tools() })),
        // A call with a proper id runs in a process of its own (see `serve`).
        "tools/call" => Err((INVALID_REQUEST, "invalid request: a tools/call needs an id that is a string or a number".to_string())),
        _ => Err((METHOD_NOT_FOUND, format!("method not found: {method}"))),
    };
    Some(match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, text)) => error_reply(id, code, text),
    })
}

fn error_reply(id: Value, code: i64, message: String) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked.filter(|v| PROTOCOL_VERSIONS.contains(v)).unwrap_or(PROTOCOL_VERSIONS[PROTOCOL_VERSIONS.len() - 1]);
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": {} },
        "serverInfo": { "name": "tensormem", "title": "tensormem", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "Diagnose PyTorch GPU memory. `doctor` on a snapshot file \
            (torch.cuda.memory._dump_snapshot, pickle or JSON) says what is wrong: the peak, growth per step, \
            retained graphs, missing no_grad, fragmentation, out-of-memory errors, each with evidence, a fix and \
            what the fix saves. `summary` gives memory_stats(), `replay` replays the trace under other allocator \
            settings or a smaller card, `predict` says what a bigger batch or context needs (and what fits a card) \
            from two or three snapshots at small sizes, `scenarios` and `run` show worked examples of each mistake and its fix.",
    })
}

/// `tensormem mcp --call --python`: one call of the Python API, in a process of its own, so that
/// a failure no process survives (memory that cannot be had aborts a Rust program) ends the
/// call, never the user's interpreter, and Ctrl-C can stop it. stdin: a line
/// `{"name", "arguments", "snapshot"}`, then, when `snapshot` is true, a snapshot's bytes to
/// the end, read as a stream. stdout: `{"lines": [...]}` or `{"error": message, "code": status}`.
pub fn python_call_from_stdin() -> Result<(), Failure> {
    end_with_parent();
    let mut input = std::io::BufReader::with_capacity(1 << 20, std::io::stdin().lock());
    let request = match read_message(&mut input)? {
        Message::Line(line) => serde_json::from_str::<Value>(&line).map_err(|e| Failure(format!("tool call: {e}"), 2))?,
        _ => return Err(Failure("tool call: expected a JSON line".into(), 2)),
    };
    let name = request["name"].as_str().unwrap_or_default().to_string();
    let snapshot = request["snapshot"].as_bool().unwrap_or(false).then(|| read_snapshot(&mut input));
    let reply = match call_tool(&name, request["arguments"].clone(), snapshot) {
        Ok(lines) => json!({ "lines": lines }),
        Err(Failure(message, code)) => json!({ "error": message, "code": code }),
    };
    println!("{reply}");
    Ok(())
}

/// A snapshot streamed in (pickle or JSON), never held whole as bytes.
fn read_snapshot(input: &mut impl BufRead) -> Result<tensormem::trace::Snapshot, String> {
    let mut loader = tensormem::trace::Loader::new(None);
    loop {
        let chunk = match input.fill_buf() {
            Ok(chunk) => chunk,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read the snapshot: {e}")),
        };
        if chunk.is_empty() {
            break;
        }
        loader.feed(chunk).map_err(|e| e.to_string())?;
        let used = chunk.len();
        input.consume(used);
    }
    loader.finish().map_err(|e| e.to_string())
}

/// On Linux, this process ends when the process that started it does (`TENSORMEM_PARENT_PID`
/// names it): a call whose caller was killed does not run on.
fn end_with_parent() {
    #[cfg(target_os = "linux")]
    if let Some(parent) = std::env::var("TENSORMEM_PARENT_PID").ok().and_then(|p| p.parse::<i32>().ok()) {
        // SAFETY: prctl and getppid change and read only this process's own state.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The parent may have gone before the request took effect.
            if libc::getppid() != parent {
                std::process::exit(1);
            }
        }
    }
}
