//! The native half of the `tensormem` Python package: the command line. The Python API
//! (`tensormem/__init__.py`) runs each tool as `python -m tensormem mcp --call --python` in a
//! process of its own, so that nothing a tool does (running out of memory aborts a Rust
//! program) can take the user's interpreter down. Nothing here panics into Python: a failure is
//! a `TensormemError` with the command line's message.

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

#[pymodule]
fn _tensormem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add("TensormemError", m.py().get_type::<TensormemError>())?;
    m.add("UsageError", m.py().get_type::<UsageError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
