//! `tensormem mcp` as an assistant drives it: JSON-RPC 2.0 over its stdin and stdout, one message a
//! line. Every read waits a bounded time.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

#[path = "../../tests/common/mod.rs"]
mod common;
use common::fixture;

/// Long enough for a debug build to diagnose a scenario on a loaded machine; a hung server fails.
const TIMEOUT: Duration = Duration::from_secs(300);

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

/// `tensormem mcp` with its stdin and stdout piped to this test.
fn spawn_server() -> Child {
    Command::new(env!("CARGO_BIN_EXE_tensormem"))
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary runs")
}

impl Server {
    fn start() -> Server {
        let mut child = spawn_server();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Server { child, stdin, lines, next_id: 0 }
    }

    fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn read(&self) -> Value {
        let line = self.lines.recv_timeout(TIMEOUT).expect("a reply within the timeout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Sends a request and returns its reply, checking the id.
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send_line(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string());
        let reply = self.read();
        assert_eq!(reply["jsonrpc"], "2.0", "{reply}");
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let reply = self.request("tools/call", json!({ "name": tool, "arguments": arguments }));
        assert!(reply.get("error").is_none(), "{reply}");
        reply["result"].clone()
    }

    fn initialized() -> Server {
        let mut server = Server::start();
        let reply =
            server.request("initialize", json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "test", "version": "0" } }));
        assert_eq!(reply["result"]["protocolVersion"], "2025-06-18");
        server.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        server
    }

    /// Closes stdin and waits for the exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not end at the end of its input");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tensormem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensormem")).args(args).output().expect("the binary runs")
}

/// A tool result's single text, as a successful tool gives it.
fn text(result: &Value) -> &str {
    assert_eq!(result["isError"], false, "{result}");
    let content = result["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{result}");
    assert_eq!(content[0]["type"], "text");
    content[0]["text"].as_str().unwrap()
}

#[test]
fn initialize_lists_the_tools_with_their_schemas_and_eof_ends_the_server() {
    let mut server = Server::start();
    let reply = server.request("initialize", json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "test", "version": "0" } }));
    let result = &reply["result"];
    assert_eq!(result["protocolVersion"], "2025-06-18");
    assert_eq!(result["capabilities"]["tools"], json!({}));
    assert_eq!(result["serverInfo"]["name"], "tensormem");
    assert!(result["serverInfo"]["version"].is_string());
    // A notification gets no reply: the next line read answers the ping.
    server.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert_eq!(server.request("ping", json!({}))["result"], json!({}));

    let tools = server.request("tools/list", json!({}))["result"]["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["doctor", "summary", "replay", "run", "predict", "fit", "scenarios"]);
    let schema = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap()["inputSchema"].clone();
    let properties = |name: &str| {
        let s = schema(name);
        assert_eq!(s["type"], "object");
        assert_eq!(s["additionalProperties"], false);
        let mut keys: Vec<String> = s["properties"].as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(properties("summary"), ["device", "file"]);
    assert_eq!(properties("replay"), ["alloc_conf", "capacity", "device", "file", "start"]);
    assert_eq!(properties("doctor"), ["capacity", "device", "file", "scenario", "set", "variant"]);
    assert_eq!(properties("run"), ["alloc_conf", "capacity", "cublas_workspace_config", "device", "name", "set", "steps", "variant"]);
    assert_eq!(properties("predict"), ["alloc_conf", "capacity", "device", "fit", "recordings", "to"]);
    assert_eq!(schema("predict")["required"], json!(["recordings"]));
    assert_eq!(properties("fit"), ["cards", "name", "set", "strategies", "vary"]);
    assert_eq!(schema("fit")["required"], json!(["name"]));
    assert!(properties("scenarios").is_empty());
    assert_eq!(schema("summary")["required"], json!(["file"]));
    assert_eq!(schema("replay")["required"], json!(["file"]));
    assert_eq!(schema("run")["required"], json!(["name"]));
    assert_eq!(schema("doctor")["required"], json!([]));
    assert_eq!(schema("replay")["properties"]["start"]["enum"], json!(["recorded", "replaced"]));
    assert_eq!(schema("doctor")["properties"]["capacity"]["type"], json!(["string", "integer"]));
    for tool in &tools {
        assert!(tool["description"].as_str().unwrap().len() > 40, "{tool}");
    }

    let status = server.finish();
    assert_eq!(status.code(), Some(0), "end of input ends the server cleanly");
}

#[test]
fn fit_returns_what_the_cli_prints() {
    let mut server = Server::initialized();
    let set = json!({ "size": "small", "context": 64, "world": 2 });
    let fit = server.call("fit", json!({ "name": "lm-train", "set": set, "strategies": ["ddp", "fsdp"], "cards": ["3GiB"] }));
    let cli = tensormem(&["fit", "lm-train", "--set", "size=small,context=64,world=2", "--strategies", "ddp,fsdp", "--cards", "3GiB", "--json"]);
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    assert_eq!(text(&fit), String::from_utf8(cli.stdout).unwrap().trim_end(), "the same bytes as `tensormem fit --json`");
    let table: Value = serde_json::from_str(text(&fit)).unwrap();
    let largest: Vec<u64> = table["cells"].as_array().unwrap().iter().map(|c| c["largest"].as_u64().unwrap()).collect();
    assert!(largest[1] > largest[0], "fsdp fits a bigger batch than ddp on 3 GiB: {largest:?}");
    assert_eq!(server.finish().code(), Some(0));
}

#[test]
fn doctor_summary_and_replay_return_what_the_cli_prints() {
    let Some(path) = fixture("small-state.pickle") else { return };
    let file = path.to_str().unwrap();
    let mut server = Server::initialized();

    let doctor = server.call("doctor", json!({ "file": file }));
    let cli = tensormem(&["doctor", file, "--json"]);
    assert!(cli.status.success());
    assert_eq!(text(&doctor), String::from_utf8(cli.stdout).unwrap().trim_end(), "the same bytes as `tensormem doctor FILE --json`");
    let findings: Value = serde_json::from_str(text(&doctor)).unwrap();
    let kinds: Vec<&str> = findings["findings"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "peak", "{kinds:?}");
    assert!(kinds.contains(&"fragmentation"), "{kinds:?}");

    let summary = server.call("summary", json!({ "file": file, "device": 0 }));
    let cli = tensormem(&["summary", file, "--device", "0", "--json"]);
    assert_eq!(text(&summary), String::from_utf8(cli.stdout).unwrap().trim_end());
    let v: Value = serde_json::from_str(text(&summary)).unwrap();
    assert_eq!(v["trace_peak_reserved_bytes"], 3_781_165_056u64);

    let replay = server.call("replay", json!({ "file": file, "alloc_conf": "expandable_segments:True", "capacity": "4GiB", "start": "recorded" }));
    let cli = tensormem(&["replay", file, "--alloc-conf", "expandable_segments:True", "--capacity", "4GiB", "--json"]);
    assert_eq!(text(&replay), String::from_utf8(cli.stdout).unwrap().trim_end());
    let v: Value = serde_json::from_str(text(&replay)).unwrap();
    assert_eq!(v["device"], 0);

    // A capacity in bytes and a device index as a number, as an assistant may give them.
    let doctor = server.call("doctor", json!({ "file": file, "device": 0, "capacity": 1_073_741_824u64 }));
    let cli = tensormem(&["doctor", file, "--device", "0", "--capacity", "1GiB", "--json"]);
    assert_eq!(text(&doctor), String::from_utf8(cli.stdout).unwrap().trim_end());
    assert_eq!(server.finish().code(), Some(0));
}

#[test]
fn scenarios_run_and_doctor_a_scenario() {
    let mut server = Server::initialized();
    let list = server.call("scenarios", json!({}));
    assert_eq!(text(&list), String::from_utf8(tensormem(&["scenarios", "--json"]).stdout).unwrap().trim_end());
    let list: Value = serde_json::from_str(text(&list)).unwrap();
    assert!(list.as_array().unwrap().iter().any(|s| s["name"] == "eval-no-grad"), "{list}");

    let run = server.call("run", json!({ "name": "eval-no-grad", "variant": "fix", "device": "sim:H100-80GB" }));
    let cli = tensormem(&["run", "eval-no-grad", "--variant", "fix", "--json"]);
    assert!(cli.status.success());
    assert_eq!(text(&run), String::from_utf8(cli.stdout).unwrap().trim_end());
    let v: Value = serde_json::from_str(text(&run)).unwrap();
    assert_eq!(v["scenario"], "eval-no-grad");

    let doctor = server.call("doctor", json!({ "scenario": "eval-no-grad", "variant": "mistake" }));
    let findings: Value = serde_json::from_str(text(&doctor)).unwrap();
    let kinds: Vec<&str> = findings["findings"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert!(kinds[1..].iter().take(2).any(|k| *k == "missing-no-grad"), "{kinds:?}");

    // A run that runs out of memory: its steps, then the CLI's error line, as an error result.
    let oom = server.call("run", json!({ "name": "eval-no-grad", "device": "sim:64MiB" }));
    assert_eq!(oom["isError"], true, "{oom}");
    let content = oom["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{oom}");
    let steps: Value = serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap();
    assert!(!steps["out_of_memory"].is_null(), "{steps}");
    assert_eq!(content[1]["text"], "error: the scenario ran out of memory (see above)");
    assert_eq!(server.finish().code(), Some(0));
}

#[test]
fn predict_returns_what_the_cli_prints_with_a_card_preset() {
    let (Some(a), Some(b)) = (fixture("gpt-medium-ctx128-inference.pickle"), fixture("gpt-medium-ctx256-inference.pickle")) else { return };
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let (a_at, b_at) = (format!("{a}@context=128"), format!("{b}@context=256"));
    let mut server = Server::initialized();
    // Recordings as the CLI writes them, or as objects; values as text or as an object.
    let predict = server.call(
        "predict",
        json!({ "recordings": [a_at, { "file": b, "values": { "context": 256 } }], "to": { "context": 1024 }, "fit": "context", "capacity": "H100-80GB" }),
    );
    let cli = tensormem(&["predict", &a_at, &b_at, "--to", "context=1024", "--fit", "context", "--capacity", "H100-80GB", "--json"]);
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    assert_eq!(text(&predict), String::from_utf8(cli.stdout).unwrap().trim_end(), "the same bytes as `tensormem predict --json`");
    let v: Value = serde_json::from_str(text(&predict)).unwrap();
    assert_eq!(v["target"], json!({ "context": 1024 }));
    assert_eq!(v["fit"]["capacity_bytes"], 85_045_379_072u64, "H100-80GB's memory");
    assert!(v["fit"]["largest"].as_u64().unwrap() > 1024, "{v}");
    assert!(v["fit"]["largest_expandable"].as_u64() >= v["fit"]["largest"].as_u64(), "{v}");

    for (arguments, message) in [
        (json!({ "recordings": [a_at] }), "error: give to (the values to predict at"),
        (json!({ "recordings": [a_at, b_at], "fit": "context" }), "error: fit needs capacity"),
        (json!({ "recordings": [a_at, b_at], "to": "context=1024", "capacity": "H100" }), "error: capacity: \"H100\" is not a size"),
        (json!({ "recordings": [a, b_at], "to": "context=1024" }), "error: "),
        (json!({ "recordings": [a_at, format!("{b}@batch=4")], "to": "context=1024" }), "error: "),
        (json!({ "recordings": [a_at, 4], "to": "context=1024" }), "error: each of recordings is"),
    ] {
        let result = server.call("predict", arguments.clone());
        assert_eq!(result["isError"], true, "{arguments}: {result}");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with(message) && !text.contains('\n'), "{arguments}: {text}");
    }
    assert_eq!(server.finish().code(), Some(0));
}

#[test]
fn errors_are_tool_results_or_json_rpc_errors() {
    let mut server = Server::initialized();
    // A file that cannot be read: the CLI's own line.
    let result = server.call("doctor", json!({ "file": "/nonexistent/file.pickle" }));
    assert_eq!(result["isError"], true);
    let cli = tensormem(&["doctor", "/nonexistent/file.pickle", "--json"]);
    let line = String::from_utf8(cli.stderr).unwrap();
    assert_eq!(result["content"], json!([{ "type": "text", "text": line.trim_end() }]));
    assert_eq!(line.trim_end(), "error: /nonexistent/file.pickle: cannot read /nonexistent/file.pickle: No such file or directory (os error 2)");

    for (tool, arguments, message) in [
        ("summary", json!({}), "error: missing argument \"file\""),
        ("summary", json!({ "file": "x.pickle", "snapshot": "out.pickle" }), "error: unknown argument \"snapshot\""),
        ("replay", json!({ "file": "x.pickle", "capacity": "lots" }), "error: capacity: "),
        ("doctor", json!({}), "error: doctor needs a FILE or --scenario NAME"),
        ("doctor", json!({ "file": "x.pickle", "scenario": "eval-no-grad" }), "error: doctor takes a file or a scenario, not both"),
        ("run", json!({ "name": "no-such-scenario" }), "error: "),
        ("run", json!({}), "error: missing argument \"name\""),
    ] {
        let result = server.call(tool, arguments.clone());
        assert_eq!(result["isError"], true, "{tool} {arguments}: {result}");
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with(message) && !text.contains('\n'), "{tool} {arguments}: {text}");
    }

    let unknown_tool = server.request("tools/call", json!({ "name": "rm", "arguments": {} }));
    assert_eq!(unknown_tool["error"]["code"], -32602, "{unknown_tool}");
    assert_eq!(unknown_tool["error"]["message"], "unknown tool: rm");
    let unknown_method = server.request("resources/list", json!({}));
    assert_eq!(unknown_method["error"]["code"], -32601, "{unknown_method}");

    server.send_line("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ");
    let malformed = server.read();
    assert_eq!(malformed["error"]["code"], -32700, "{malformed}");
    assert!(malformed["id"].is_null());
    // The server goes on after a bad line.
    assert_eq!(server.request("ping", json!({}))["result"], json!({}));
    assert_eq!(server.finish().code(), Some(0));
}

/// Issue 30's hostile lines: a line that is not UTF-8 and one of 17 MiB are answered with an
/// error and the server goes on; a long call does not hold up the next request, and
/// `notifications/cancelled` ends it (no answer for it, and the server ends at the end of its
/// input without waiting for it).
#[test]
fn hostile_lines_are_answered_and_a_long_call_is_cancelled() {
    let mut server = Server::initialized();
    let tools = server.request("tools/list", json!({}));
    for tool in tools["result"]["tools"].as_array().unwrap() {
        let long = tool["name"] != "scenarios";
        assert_eq!(tool["_meta"]["tensormem/long_running"], long, "{tool}");
        assert_eq!(tool["annotations"]["readOnlyHint"], true, "{tool}");
    }

    let stdin = server.stdin.as_mut().unwrap();
    stdin.write_all(b"\xff\xfe not text\n").unwrap();
    stdin.flush().unwrap();
    let reply = server.read();
    assert_eq!(reply["error"]["code"], -32700, "{reply}");
    assert_eq!(server.request("ping", json!({}))["result"], json!({}));

    let huge = vec![b'x'; 17 << 20];
    let stdin = server.stdin.as_mut().unwrap();
    stdin.write_all(&huge).unwrap();
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
    let reply = server.read();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap().contains("longer than 16 MiB"), "{reply}");
    assert_eq!(server.request("ping", json!({}))["result"], json!({}));

    // A model of 3,000 layers (the stack overflow that ended the server) is refused, and the
    // server answers on.
    let config = json!({ "model_type": "llama", "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 3000,
        "num_attention_heads": 1, "num_key_value_heads": 1, "vocab_size": 8 });
    let deep = server.call("run", json!({ "name": "hf-train", "set": { "config": config.to_string(), "context": 8, "warmup": 0 } }));
    assert_eq!(deep["isError"], true, "{deep}");
    assert!(deep["content"][0]["text"].as_str().unwrap().contains("3000 layers is more than 1024"), "{deep}");
    assert_eq!(server.request("ping", json!({}))["result"], json!({}));

    // A generation of 16,000 tokens (512,000 layer passes, under the budget): minutes in a debug build.
    let long = json!({ "jsonrpc": "2.0", "id": "long", "method": "tools/call",
        "params": { "name": "run", "arguments": { "name": "hf-generate", "set": { "new_tokens": 16000 } } } });
    server.send_line(&long.to_string());
    assert_eq!(server.request("ping", json!({}))["result"], json!({}), "answered while the call runs");
    // Its id, reused while it runs, is refused (the answer would go to the wrong call).
    server.send_line(&long.to_string());
    let reused = server.read();
    assert_eq!((&reused["id"], &reused["error"]["code"]), (&json!("long"), &json!(-32600)), "{reused}");
    // A tools/call without a usable id is refused, not run inside the server.
    server.send_line(&json!({ "jsonrpc": "2.0", "id": null, "method": "tools/call", "params": { "name": "scenarios" } }).to_string());
    assert_eq!(server.read()["error"]["code"], -32600);
    server.send_line(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": "long", "reason": "test" } }).to_string());
    assert_eq!(server.request("ping", json!({}))["result"], json!({}));
    let started = Instant::now();
    drop(server.stdin.take());
    let mut replies = Vec::new();
    while let Ok(line) = server.lines.recv_timeout(Duration::from_secs(60)) {
        replies.push(line);
    }
    assert!(started.elapsed() < Duration::from_secs(60), "the cancelled call was not stopped");
    assert!(replies.iter().all(|r| !r.contains("\"long\"")), "a cancelled call gets no answer: {replies:?}");
    assert_eq!(server.finish().code(), Some(0));
}

#[test]
fn an_id_that_cannot_be_echoed_exactly_is_refused() {
    let mut server = Server::initialized();
    for id in ["123456789012345678901234567890", "18446744073709551616", "1.5"] {
        for method in ["ping", "tools/call"] {
            server.send_line(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"name":"scenarios","arguments":{{}}}}}}"#));
            let reply = server.read();
            assert_eq!(reply["id"], Value::Null, "{id} {method}: {reply}");
            assert_eq!(reply["error"]["code"], -32600, "{id} {method}: {reply}");
            assert!(reply["error"]["message"].as_str().unwrap().contains("64 bits"), "{reply}");
        }
    }
    // The largest ids that fit are echoed as they were written.
    for id in ["18446744073709551615", "-9223372036854775808"] {
        server.send_line(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
        let line = server.lines.recv_timeout(TIMEOUT).unwrap();
        assert!(line.contains(&format!("\"id\":{id}")), "{line}");
    }
    assert_eq!(server.finish().code(), Some(0));
}

#[test]
fn a_client_that_closes_both_ends_stops_its_calls() {
    let mut child = spawn_server();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // Minutes in a debug build: only a server that stops its calls ends soon.
    let long = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": { "name": "run", "arguments": { "name": "hf-generate", "set": { "new_tokens": 16000 } } } });
    writeln!(stdin, "{long}").unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":8,"method":"ping"}}"#).unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"id\":8"), "answered while the call runs: {line}");
    // The client goes away: both its ends close.
    let started = Instant::now();
    drop(stdout);
    drop(stdin);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the server waited on a call nobody can read the answer of");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}
