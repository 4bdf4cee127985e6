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

use crate::{DoctorRequest, Failure, ScenarioRun, diagnose, json_line, parse_set, predict_files, replay_file, run_outcome, run_scenario, summary_json};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use tensormem::predict::PredictOptions;
use tensormem::replay::StartMode;
use tensormem::{report, scenarios};

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

/// A JSON Schema property.
fn property(types: &[&str], description: &str) -> Value {
    let kind = if types.len() == 1 { json!(types[0]) } else { json!(types) };
    json!({ "type": kind, "description": description })
}

fn schema(properties: Vec<(&str, Value)>, required: &[&str]) -> Value {
    let properties: Map<String, Value> = properties.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

fn set_property() -> Value {
    json!({
        "type": "object",
        "additionalProperties": { "type": ["string", "number", "boolean"] },
        "description": "Scenario parameters, e.g. {\"layers\": 4, \"hidden\": 2048} (see the scenarios tool).",
    })
}

/// The tools, as `tools/list` gives them.
/// The doctor tool's description, its kinds read from the doctor's registry.
fn doctor_description() -> String {
    use tensormem::doctor::{REGISTRY, Role};
    let listed = |role: Role| REGISTRY.iter().filter(|k| k.role == role).map(|k| format!("{} ({})", k.name, k.about)).collect::<Vec<_>>().join(", ");
    format!(
        "Say what is wrong with a snapshot's memory, or a scenario's: first the summary ({}), then the problems ranked by the \
         bytes at stake (an oom first): {}; then the inconclusive ones (confidence \"inconclusive\": what the trace cannot \
         tell); {} when there is no problem; {} last. Each finding has evidence, why, the fix, a confidence (high, medium, \
         inconclusive) and, where measured, what the fix saves. Returns {{\"findings\": [...]}}, as `tensormem doctor --json`. \
         Give a file or a scenario.",
        listed(Role::Summary),
        listed(Role::Problem),
        listed(Role::WhenNoProblem),
        listed(Role::Last)
    )
}

fn tools() -> Vec<Value> {
    let file = || property(&["string"], "Path of a PyTorch memory snapshot on this machine: pickle (torch.cuda.memory._dump_snapshot) or JSON.");
    let capacity = |what: &str| property(&["string", "integer"], &format!("{what}: bytes or a size such as 80GiB, 24GB, 512MiB."));
    let alloc_conf = || property(&["string"], "Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. expandable_segments:True.");
    let variant = || property(&["string"], "`mistake` or `fix`, for scenarios that show a mistake (default: mistake).");
    // Every tool only reads; all but `scenarios` can take long (a large file, a big model, many
    // steps): they say so, and a client may cancel them (`notifications/cancelled`).
    let tool = |name: &str, description: &str, input: Value| {
        let long = name != "scenarios";
        let description = match long {
            true => {
                format!("{description} Can take minutes on large inputs; the server answers other requests meanwhile, and notifications/cancelled stops it.")
            }
            false => description.to_string(),
        };
        json!({
            "name": name,
            "description": description,
            "inputSchema": input,
            "annotations": { "readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false },
            "_meta": { "tensormem/long_running": long },
        })
    };
    vec![
        tool(
            "doctor",
            &doctor_description(),
            schema(
                vec![
                    ("file", file()),
                    ("scenario", property(&["string"], "Run this scenario on a simulated card and diagnose its trace instead of a file.")),
                    ("variant", variant()),
                    ("set", set_property()),
                    (
                        "device",
                        property(
                            &["integer", "string"],
                            "A file's device index (default: the one with an out-of-memory error, else the one that reserved the most); \
                             with a scenario, the card: sim:PRESET (e.g. sim:H100-80GB) or sim:SIZE.",
                        ),
                    ),
                    ("capacity", capacity("Check the trace against a card of this size (an oom finding when it does not fit)")),
                ],
                &[],
            ),
        ),
        tool(
            "summary",
            "memory_summary() figures of a snapshot's final state (memory_stats()) and the peaks its trace shows, one JSON \
             object per device, as `tensormem summary --json`.",
            schema(vec![("file", file()), ("device", property(&["integer"], "Only this device (default: every device)."))], &["file"]),
        ),
        tool(
            "replay",
            "Replay a snapshot through tensormem's copy of PyTorch's caching allocator, with the file's settings or others, \
             on a card of a given size: segment allocations, peaks, out-of-memory errors and how far the decisions match \
             the recorded ones, one JSON object per device, as `tensormem replay --json`.",
            schema(
                vec![
                    ("file", file()),
                    ("device", property(&["integer"], "Only this device (default: every device with a trace or segments).")),
                    ("alloc_conf", alloc_conf()),
                    ("capacity", capacity("Device memory (default: unlimited)")),
                    (
                        "start",
                        json!({ "type": "string", "enum": ["recorded", "replaced"],
                            "description": "Start state: recorded (the file's segments, exact) or replaced (only live allocations, placed afresh)." }),
                    ),
                ],
                &["file"],
            ),
        ),
        tool(
            "run",
            "Run a scenario (a worked example of a training or inference mistake, or its fix) on a simulated card: labelled \
             steps with allocated and reserved bytes, as `tensormem run --json`. Running out of memory is an error after the result.",
            schema(
                vec![
                    ("name", property(&["string"], "Scenario name (see the scenarios tool).")),
                    ("variant", variant()),
                    ("set", set_property()),
                    ("device", property(&["string"], "sim:PRESET (e.g. sim:H100-80GB, the default), sim:SIZE (e.g. sim:24GiB) or gpu.")),
                    ("capacity", capacity("Device memory, overriding the card's")),
                    ("alloc_conf", alloc_conf()),
                    (
                        "cublas_workspace_config",
                        property(
                            &["string"],
                            "cuBLAS's workspace per thread in CUBLAS_WORKSPACE_CONFIG syntax (e.g. :4096:8); default: PyTorch's for the card.",
                        ),
                    ),
                    ("steps", property(&["integer"], "Steps to record (training scenarios: after the `warmup` steps).")),
                ],
                &["name"],
            ),
        ),
        tool(
            "predict",
            "Predict a program's memory at another batch or context from two or three snapshots of it at small values \
             (the user says which values each was recorded at): allocations aligned, each size's law fitted, the trace at \
             the target replayed through the caching allocator. With fit and capacity, also the largest value that fits \
             the card (with the recordings' settings and with expandable_segments:True). Returns {target, \
             peak_allocated_bytes, peak_reserved_bytes, peak_phase, out_of_memory, aligned_fraction, unaligned_bytes, how_sure \
             (the bytes at the peak on checked laws, extrapolated ones and recorded sizes; a warning far outside the \
             recorded values), laws, fit, warnings (what looks mislabeled: memory falling as a variable grows, laws \
             negative at the target)}, as `tensormem predict --json`. Recordings of the same run given different values \
             are refused.",
            schema(
                vec![
                    (
                        "recordings",
                        json!({ "type": "array", "minItems": 1,
                            "items": { "type": ["string", "object"] },
                            "description": "Snapshots of one program, each as \"FILE@name=value[,name=value]\" (e.g. small.pickle@context=128) \
                                or {\"file\": PATH, \"values\": {\"context\": 128}}." }),
                    ),
                    (
                        "to",
                        property(
                            &["string", "object"],
                            "The values to predict at: \"context=1024\" or {\"context\": 1024} (with fit, the fitted variable defaults to the largest value that fits).",
                        ),
                    ),
                    ("fit", property(&["string"], "Find the largest value of this variable that fits capacity (needs capacity).")),
                    ("capacity", capacity("Device memory, or a card preset such as H100-80GB, A100-40GB, RTX4090-24GB (default: unlimited)")),
                    ("alloc_conf", alloc_conf()),
                    (
                        "device",
                        property(
                            &["integer"],
                            "The snapshots' device index (default: the one with an out-of-memory error, else the one that reserved the most).",
                        ),
                    ),
                ],
                &["recordings"],
            ),
        ),
        tool(
            "fit",
            "What fits: for a training scenario (lm-train, gpt2-train, oom, hf-train, with its parameters in set, e.g. \
             config=llama-3-8b, world=8, lora=16), the largest batch (or context) that runs without any rank running out of \
             memory, found by running the step, for every strategy on every card. Returns {scenario, vary, world, cells: \
             [{strategy, card, capacity_bytes, largest, heaviest_rank, peak_allocated_bytes, peak_reserved_bytes, limited_by, \
             runs}]}, as `tensormem fit --json`.",
            schema(
                vec![
                    ("name", property(&["string"], "A training scenario: lm-train, gpt2-train, oom or hf-train.")),
                    ("set", set_property()),
                    ("vary", json!({ "type": "string", "enum": ["batch", "context"], "description": "The parameter to search (default batch)." })),
                    (
                        "strategies",
                        json!({ "type": "array", "items": { "type": "string", "enum": tensormem::nn::parallel::Strategy::names() },
                            "description": format!("Strategies to compare (default {}); all but ddp need world > 1 in set.", scenarios::fit::default_strategies().join(", ")) }),
                    ),
                    (
                        "cards",
                        json!({ "type": "array", "items": { "type": "string" },
                            "description": "Cards: simulator presets (MI300X-192GB, B200-180GB, H200-141GB, H100-80GB, A100-80GB, RTX-A6000-48GB, L40S-48GB, A100-40GB, RTX5090-32GB, RTX3090-24GB, RTX4090-24GB, A10-24GB, L4-24GB, T4-16GB) or sizes such as 24GiB (default H100-80GB, A100-40GB, RTX4090-24GB)." }),
                    ),
                ],
                &["name"],
            ),
        ),
        tool("scenarios", "List the scenarios, with their parameters and variants, as `tensormem scenarios --json`.", schema(vec![], &[])),
    ]
}

/// `tools/call`: the tool's output lines, or its failure as a result with `isError`.
fn call(params: &Value) -> Result<Value, (i64, String)> {
    let name = params.get("name").and_then(Value::as_str).ok_or((INVALID_PARAMS, "tools/call needs a tool name".to_string()))?;
    let tools = tools();
    let tool = tools.iter().find(|t| t["name"] == name).ok_or_else(|| (INVALID_PARAMS, format!("unknown tool: {name}")))?;
    let args = match params.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(args)) => args.clone(),
        Some(_) => return Err((INVALID_PARAMS, "tools/call arguments must be an object".into())),
    };
    let (lines, outcome) = run_checked(tool, args, None);
    let mut content = Vec::new();
    if !lines.is_empty() {
        content.push(json!({ "type": "text", "text": lines.join("\n") }));
    }
    if let Err(Failure(message, _)) = &outcome {
        content.push(json!({ "type": "text", "text": format!("error: {message}") }));
    }
    Ok(json!({ "content": content, "isError": outcome.is_err() }))
}

/// A tool's output lines (what the subcommand's `--json` prints), for the Python API: its
/// arguments an object as `tools/call` takes them; `snapshot`, a snapshot read in place of a
/// `file` (or why it could not be).
fn call_tool(name: &str, arguments: Value, snapshot: Option<Result<tensormem::trace::Snapshot, String>>) -> Result<Vec<String>, Failure> {
    let tools = tools();
    let Some(tool) = tools.iter().find(|t| t["name"] == name) else {
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        return Err(Failure(format!("unknown tool: {name} (one of {})", names.join(", ")), 2));
    };
    let args = match arguments {
        Value::Null => Map::new(),
        Value::Object(args) => args,
        other => return Err(Failure(format!("a tool's arguments are an object, got {other}"), 2)),
    };
    let (lines, outcome) = run_checked(tool, args, snapshot);
    outcome.map(|()| lines)
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

/// Checks the arguments against the tool's schema and runs it; a panic becomes a failure.
/// `snapshot`: a snapshot given in place of a file (already read, or why it could not be).
fn run_checked(tool: &Value, mut args: Map<String, Value>, snapshot: Option<Result<tensormem::trace::Snapshot, String>>) -> (Vec<String>, Result<(), Failure>) {
    let name = tool["name"].as_str().expect("every tool has a name");
    let mut lines = Vec::new();
    let given = match snapshot {
        None => None,
        Some(_) if args.contains_key("file") => return (lines, Err(Failure("give a snapshot or a file, not both".into(), 2))),
        Some(Ok(snapshot)) => {
            args.insert("file".into(), Value::String(crate::GIVEN_FILE.into()));
            Some(snapshot)
        }
        Some(Err(e)) => return (lines, Err(Failure(format!("{}: {e}", crate::GIVEN_FILE), 1))),
    };
    let _given = crate::GivenSnapshot::hold(given);
    let args = Args(args);
    let outcome = args.check(&tool["inputSchema"]).and_then(|()| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_tool(name, &args, &mut lines)))
            .unwrap_or_else(|_| Err(Failure(format!("tensormem failed inside the {name} tool (a bug: please report it)"), 1)))
    });
    (lines, outcome)
}

/// Runs one tool; its output lines are what the subcommand's `--json` prints.
fn run_tool(name: &str, args: &Args, lines: &mut Vec<String>) -> Result<(), Failure> {
    match name {
        "summary" => {
            let results = replay_file(&args.path("file")?, args.int("device")?, None, None, StartMode::default(), false, false)?;
            for r in &results {
                lines.push(json_line(&summary_json(r))?);
            }
        }
        "replay" => {
            let start = args.string("start")?.map(|s| StartMode::parse(&s).map_err(|e| Failure(e, 2))).transpose()?.unwrap_or_default();
            let alloc_conf = args.string("alloc_conf")?;
            let results = replay_file(&args.path("file")?, args.int("device")?, alloc_conf.as_deref(), args.size("capacity")?, start, false, false)?;
            for r in &results {
                lines.push(json_line(r)?);
            }
        }
        "doctor" => {
            let (file, scenario) = (args.string("file")?.map(PathBuf::from), args.string("scenario")?);
            match (&file, &scenario) {
                (Some(_), Some(_)) => return Err(Failure("doctor takes a file or a scenario, not both".into(), 2)),
                (Some(_), None) if args.has("variant") || args.has("set") => return Err(Failure("variant and set go with a scenario".into(), 2)),
                _ => {}
            }
            let request = DoctorRequest {
                file,
                scenario,
                variant: args.string("variant")?,
                set: args.set()?,
                device: args.string("device")?,
                capacity: args.size("capacity")?,
            };
            let diagnosis = diagnose(request)?;
            lines.push(json_line(&diagnosis)?);
        }
        "run" => {
            let name = args.required("name")?;
            let device = args.string("device")?.unwrap_or_else(|| "sim:H100-80GB".into());
            let steps = args.int("steps")?.map(|s| u64::try_from(s).map_err(|_| Failure(format!("steps must be a count, got {s}"), 2))).transpose()?;
            let (variant, set, capacity, alloc_conf) = (args.string("variant")?, args.set()?, args.size("capacity")?, args.string("alloc_conf")?);
            let cublas_workspace_config = args.string("cublas_workspace_config")?;
            let result = run_scenario(ScenarioRun { name, variant, set, device, capacity, alloc_conf, cublas_workspace_config, steps })?;
            lines.push(json_line(&result)?);
            run_outcome(&result, None)?;
        }
        "predict" => {
            let specs = args.recordings()?;
            let to = args.values("to")?;
            let fit = args.string("fit")?;
            if fit.is_some() && !args.has("capacity") {
                return Err(Failure("fit needs capacity: the card's memory (a size, or a preset such as H100-80GB)".into(), 2));
            }
            if fit.is_none() && to.is_none() {
                return Err(Failure("give to (the values to predict at, e.g. \"context=1024\") or fit with capacity".into(), 2));
            }
            let capacity =
                args.string("capacity")?.map(|c| tensormem::device::parse_capacity(&c).map_err(|e| Failure(format!("capacity: {e}"), 2))).transpose()?;
            let options = PredictOptions { device: args.int("device")?, capacity, config: None, keep_snapshot: false };
            let (prediction, _) = predict_files(&specs, to.as_deref(), fit.as_deref(), options, args.string("alloc_conf")?.as_deref(), None)?;
            lines.push(json_line(&prediction)?);
        }
        "fit" => {
            let request = scenarios::RunRequest { scenario: args.required("name")?, set: parse_set(&args.set()?)?, ..Default::default() };
            let list = |key: &str, default: &[&str]| -> Result<Vec<String>, Failure> {
                match args.0.get(key) {
                    None | Some(Value::Null) => Ok(default.iter().map(|s| s.to_string()).collect()),
                    Some(Value::Array(items)) => {
                        items.iter().map(|v| v.as_str().map(String::from).ok_or_else(|| Failure(format!("{key} takes strings, got {v}"), 2))).collect()
                    }
                    Some(other) => Err(Failure(format!("{key} takes a list of strings, got {other}"), 2)),
                }
            };
            let strategies = list("strategies", scenarios::fit::default_strategies())?;
            let cards = list("cards", &scenarios::fit::DEFAULT_CARDS)?;
            let vary = args.string("vary")?.unwrap_or_else(|| "batch".into());
            let table = scenarios::fit::fit_table(&request, &vary, &strategies, &cards, &mut |_, _| {}).map_err(|e| Failure(e.to_string(), 2))?;
            lines.push(json_line(&table)?);
        }
        "scenarios" => lines.push(json_line(&scenarios::list())?),
        _ => unreachable!("call() checks the name"),
    }
    Ok(())
}

/// A tool call's arguments, read as the command line reads its options.
struct Args(Map<String, Value>);

impl Args {
    /// Every argument is one the tool's schema names.
    fn check(&self, schema: &Value) -> Result<(), Failure> {
        match self.0.keys().find(|k| schema["properties"].get(k.as_str()).is_none()) {
            Some(k) => Err(Failure(format!("unknown argument {k:?}"), 2)),
            None => Ok(()),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.0.get(key).is_some_and(|v| !v.is_null())
    }

    /// A string; a number is taken as its text (a device index).
    fn string(&self, key: &str) -> Result<Option<String>, Failure> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(Failure(format!("{key} must be a string, got {other}"), 2)),
        }
    }

    fn required(&self, key: &str) -> Result<String, Failure> {
        self.string(key)?.ok_or_else(|| Failure(format!("missing argument {key:?}"), 2))
    }

    fn path(&self, key: &str) -> Result<PathBuf, Failure> {
        let path = self.required(key)?;
        // No file system takes a longer name; a message repeating it would be as long.
        if path.len() > 4096 {
            return Err(Failure(format!("{key}: {} bytes is longer than any path (4,096 at most): give a file's path", path.len()), 2));
        }
        Ok(PathBuf::from(path))
    }

    fn int(&self, key: &str) -> Result<Option<i64>, Failure> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
            Some(Value::String(s)) if s.trim().parse::<i64>().is_ok() => Ok(s.trim().parse().ok()),
            Some(other) => Err(Failure(format!("{key} must be an integer, got {other}"), 2)),
        }
    }

    /// Bytes, or a size as the command line takes it (80GiB, 24GB, 512MiB).
    fn size(&self, key: &str) -> Result<Option<u64>, Failure> {
        self.string(key)?.map(|s| report::parse_size(&s).map_err(|e| Failure(format!("{key}: {e}"), 2))).transpose()
    }

    /// Values as the command line writes them (`context=1024`), from that text or an object.
    fn values(&self, key: &str) -> Result<Option<String>, Failure> {
        match self.0.get(key) {
            Some(Value::Object(m)) => Ok(Some(values_text(key, m)?)),
            _ => self.string(key),
        }
    }

    /// `recordings` as the command line's FILE@name=value arguments.
    fn recordings(&self) -> Result<Vec<String>, Failure> {
        let bad = |v: &Value| Failure(format!("each of recordings is \"FILE@name=value\" or {{\"file\": PATH, \"values\": {{\"name\": value}}}}, got {v}"), 2);
        let Some(Value::Array(items)) = self.0.get("recordings") else {
            return Err(Failure(
                "recordings must be a list of snapshots with their values, e.g. [\"small.pickle@context=128\", \"big.pickle@context=256\"]".into(),
                2,
            ));
        };
        items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                Value::Object(m) => {
                    let file = m.get("file").and_then(Value::as_str).ok_or_else(|| bad(item))?;
                    let values = match m.get("values") {
                        Some(Value::Object(v)) => values_text("values", v)?,
                        Some(Value::String(v)) => v.clone(),
                        _ => return Err(bad(item)),
                    };
                    Ok(format!("{file}@{values}"))
                }
                _ => Err(bad(item)),
            })
            .collect()
    }

    /// Scenario parameters as `--set KEY=VALUE` items: from an object, or a list of such strings.
    fn set(&self) -> Result<Vec<String>, Failure> {
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
            _ => None,
        };
        let bad = |v: &Value| Failure(format!("set must map parameter names to values, got {v}"), 2);
        match self.0.get("set") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    let item = text(v).map(|v| format!("{k}={v}")).ok_or_else(|| bad(v))?;
                    // One name, one value: a value must not read as more settings after a comma.
                    match crate::split_settings(&item).as_slice() {
                        [_] => Ok(item),
                        [_, extra, ..] => Err(Failure(
                            format!("set: the value of {k} holds another setting after a comma ({extra:?}); a value sets its own parameter only"),
                            2,
                        )),
                        [] => Err(bad(v)),
                    }
                })
                .collect(),
            Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad(v))).collect(),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(other) => Err(bad(other)),
        }
    }
}

/// `{"context": 128}` as `context=128`.
fn values_text(key: &str, m: &Map<String, Value>) -> Result<String, Failure> {
    let items: Vec<String> = m
        .iter()
        .map(|(k, v)| match v {
            Value::Number(n) => Ok(format!("{k}={n}")),
            Value::String(s) => Ok(format!("{k}={s}")),
            _ => Err(Failure(format!("{key}: {k} must be a whole number, got {v}"), 2)),
        })
        .collect::<Result<_, _>>()?;
    Ok(items.join(","))
}
