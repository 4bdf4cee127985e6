//! `tensormem`: the command line (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(native_runner::main(std::env::args_os(), None))
}
