//! The registry of finding kinds: one row per kind (its name, the page's label, one line about
//! it, its role in the diagnosis, the function that finds it and the threshold its bytes must
//! pass). `diagnose` runs the rows, `KINDS`, the page's labels (each finding carries its own)
//! and the MCP tool's description read them: a new kind is its module and one row.

use super::{DoctorError, DoctorOptions, Finding, Material, Patient, ops::Ops, steps::Steps};

/// Where a kind's findings go in the diagnosis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// What the memory is made of at its peak: always first.
    Summary,
    /// Something to fix: ranked by its bytes (an `oom` first).
    Problem,
    /// Information given only when no problem is found.
    WhenNoProblem,
    /// Information always given, last.
    Last,
}

/// What every finder looks at: the device's trace laid out once, its training loop, the op of
/// each allocation, and the options given.
pub(super) struct Exam<'a> {
    pub(super) patient: Patient<'a>,
    pub(super) steps: Steps,
    pub(super) ops: Ops,
    pub(super) options: &'a DoctorOptions,
}

/// The one signature of a finder.
pub(super) type Finder = fn(&Exam) -> Result<Option<Finding>, DoctorError>;

/// One row of the registry.
pub struct Kind {
    /// The stable name (a contract: the page and outside checks read it).
    pub name: &'static str,
    /// The page's label.
    pub label: &'static str,
    /// What it is about, in a few words (the MCP tool's description lists them).
    pub about: &'static str,
    pub role: Role,
    pub(super) find: Finder,
    pub material: Material,
}
