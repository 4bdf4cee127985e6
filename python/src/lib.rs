//! The native half of the `tensormem` Python package: the command line, and the tools whose
//! `--json` lines the Python API (`tensormem/__init__.py`) turns into dicts. Nothing here panics
//! into Python: a failure is a `TensormemError` with the command line's message.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

create_exception!(_tensormem, TensormemError, PyException, "tensormem could not do what was asked; the message says why, as the command line does.");
create_exception!(_tensormem, UsageError, TensormemError, "The request itself is wrong (an unknown name, a bad setting): the command line's exit status 2.");

/// Runs the command line on `args` (without the program's name); returns its exit status.
/// `page`: the packaged page's folder, which `serve` uses when given no `--root`.
#[pyfunction]
#[pyo3(signature = (args, page=None))]
fn cli(py: Python<'_>, args: Vec<String>, page: Option<PathBuf>) -> PyResult<u8> {
    let argv = std::iter::once("tensormem".to_string()).chain(args).map(std::ffi::OsString::from);
    py.detach(|| catch_unwind(AssertUnwindSafe(|| native_runner::main(argv, page))))
        .map_err(|_| TensormemError::new_err("tensormem failed (a bug: please report it with the command that failed)"))
}

/// One tool's output lines (a subcommand's `--json`): `arguments` a JSON object as the MCP
/// server's tool takes it; `snapshot`, a snapshot's bytes read in place of a `file`.
#[pyfunction]
#[pyo3(signature = (name, arguments, snapshot=None))]
fn tool(py: Python<'_>, name: &str, arguments: &str, snapshot: Option<&[u8]>) -> PyResult<Vec<String>> {
    let arguments: serde_json::Value = serde_json::from_str(arguments).map_err(|e| UsageError::new_err(format!("the arguments are not JSON: {e}")))?;
    let answer = py.detach(|| catch_unwind(AssertUnwindSafe(|| native_runner::call_tool(name, arguments, snapshot))));
    match answer {
        Ok(Ok(lines)) => Ok(lines),
        Ok(Err((message, 2))) => Err(UsageError::new_err(message)),
        Ok(Err((message, _))) => Err(TensormemError::new_err(message)),
        Err(_) => Err(TensormemError::new_err(format!("tensormem failed inside {name} (a bug: please report it)"))),
    }
}

#[pymodule]
fn _tensormem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(tool, m)?)?;
    m.add("TensormemError", m.py().get_type::<TensormemError>())?;
    m.add("UsageError", m.py().get_type::<UsageError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
