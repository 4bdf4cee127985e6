//! Snapshots that arrive through pipes (issue 49): a pipe is read to its end however slowly its
//! writer writes, and a named pipe that nobody writes to is an error within a bounded wait, not
//! a hang, for every command that reads a file.
#![cfg(unix)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/common/mod.rs"]
mod common;
use common::fixture;

fn exe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tensormem"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tensormem-pipes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `summary --json` of `args` with `bytes` written to its stdin in small pieces, pausing after
/// the first: every read but the last is short.
fn summary_from_slow_pipe(bytes: &[u8]) -> Output {
    let mut child = exe().args(["summary", "/dev/stdin", "--json"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let bytes = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let (head, rest) = bytes.split_at(100);
        stdin.write_all(head).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for piece in rest.chunks(7_000) {
            if stdin.write_all(piece).is_err() {
                break;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

#[test]
fn a_snapshot_through_a_slow_pipe_reads_as_the_same_file() {
    let Some(path) = fixture("gpt-medium-ctx128-inference.pickle") else { return };
    let whole = exe().args(["summary", path.to_str().unwrap(), "--json"]).output().unwrap();
    assert!(whole.status.success(), "{}", stderr(&whole));
    let piped = summary_from_slow_pipe(&std::fs::read(&path).unwrap());
    assert!(piped.status.success(), "a whole pickle through a pipe is whole: {}", stderr(&piped));
    assert_eq!(stdout(&piped), stdout(&whole), "the pipe's summary is the file's");

    // A pipe that really is cut short is still a truncation, with where it ends.
    let bytes = std::fs::read(&path).unwrap();
    let cut = summary_from_slow_pipe(&bytes[..bytes.len() / 2]);
    assert_eq!(cut.status.code(), Some(1), "{}", stderr(&cut));
    assert!(stderr(&cut).contains("truncated"), "{}", stderr(&cut));
}

/// A pipe whose first bytes are not a snapshot is refused while its writer still holds it open
/// and writes nothing more: the reading thread does not hold the answer back.
#[test]
fn bad_bytes_from_a_pipe_still_open_are_refused_at_once() {
    let mut child = exe().args(["summary", "/dev/stdin"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"\x80\x04\xff not a snapshot").unwrap();
    stdin.flush().unwrap();
    // The pipe stays open (`stdin` lives) until the command has answered, or a minute passed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(status.is_some(), "the command waited for the pipe's writer: {}", stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("unknown opcode 0xff"), "{}", stderr(&out));
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success());
}

/// Runs `args` with a short pipe wait and returns its output and how long it took.
fn timed(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = exe().args(args).env("TENSORMEM_PIPE_WAIT", "0.5").stdin(Stdio::null()).output().unwrap();
    (out, start.elapsed())
}

#[test]
fn a_named_pipe_without_a_writer_is_an_error_not_a_hang() {
    let dir = scratch("fifo");
    let fifo = dir.join("f.pickle");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    let config = format!("config={f}");
    for args in [vec!["doctor", f], vec!["replay", f], vec!["summary", f], vec!["run", "hf-train", "--set", config.as_str()], vec!["serve", f, "--port", "0"]] {
        let (out, took) = timed(&args);
        assert!(!out.status.success(), "{args:?} fails");
        assert!(took < Duration::from_secs(20), "{args:?} took {took:?}");
        let message = stderr(&out);
        assert!(message.contains("named pipe") || message.contains("not a regular file"), "{args:?}: {message}");
        assert_eq!(message.trim().lines().count(), 1, "{args:?}: one line: {message}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_named_pipe_with_a_writer_is_read() {
    let Some(path) = fixture("small-state.pickle") else { return };
    let dir = scratch("fifo-writer");
    let fifo = dir.join("f.pickle");
    mkfifo(&fifo);
    let bytes = std::fs::read(&path).unwrap();
    let target = fifo.clone();
    // The writer comes a little after the reader has started waiting.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        std::fs::OpenOptions::new().write(true).open(&target).unwrap().write_all(&bytes).unwrap();
    });
    let out = exe().args(["summary", fifo.to_str().unwrap(), "--json"]).env("TENSORMEM_PIPE_WAIT", "30").output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let whole = exe().args(["summary", path.to_str().unwrap(), "--json"]).output().unwrap();
    assert_eq!(stdout(&out), stdout(&whole));
    std::fs::remove_dir_all(&dir).unwrap();
}
