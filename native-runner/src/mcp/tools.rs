//! The MCP server's tools: their catalogue (`tools/list`: names, descriptions, JSON Schemas) and
//! a call's arguments checked against the schema and run as the subcommand runs them, its output
//! the lines its `--json` prints. The transport (`mod.rs`) runs each call in a process of its own.

use super::INVALID_PARAMS;
use crate::{DoctorRequest, Failure, ScenarioRun, diagnose, json_line, parse_set, predict_files, replay_file, run_outcome, run_scenario, summary_json};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use tensormem::predict::PredictOptions;
use tensormem::replay::StartMode;
use tensormem::{report, scenarios};

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

/// The tools, as `tools/list` gives them.
pub(super) fn tools() -> Vec<Value> {
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
                            "description": format!("Cards: simulator presets ({}) or sizes such as 24GiB (default {}).",
                                tensormem::device::PRESETS.map(|p| p.0).join(", "), scenarios::fit::DEFAULT_CARDS.join(", ")) }),
                    ),
                ],
                &["name"],
            ),
        ),
        tool("scenarios", "List the scenarios, with their parameters and variants, as `tensormem scenarios --json`.", schema(vec![], &[])),
    ]
}

/// `tools/call`: the tool's output lines, or its failure as a result with `isError`.
pub(super) fn call(params: &Value) -> Result<Value, (i64, String)> {
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
pub(super) fn call_tool(name: &str, arguments: Value, snapshot: Option<Result<tensormem::trace::Snapshot, String>>) -> Result<Vec<String>, Failure> {
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
