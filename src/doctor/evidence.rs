//! What each finding rests on: one type per finding kind, serialised with serde. `doctor --json`,
//! MCP and the page carry each type's fields under the names written here; the terminal printer
//! reads the types, and `tests/doctor_evidence.rs` checks every key the page reads against what
//! the finders write. A new kind adds its type and one row below.

use serde_json::Value;

pub use super::categories::CategoryBytes;
pub use super::copies::{CopiesEvidence, OpBytes};
pub use super::fragmentation::FragmentationEvidence;
pub use super::grads::GradsKeptEvidence;
pub use super::growth::GrowthEvidence;
pub use super::intermediates::IntermediatesEvidence;
pub use super::kept::KeptActivationsEvidence;
pub use super::no_grad::{EarlierGraph, MissingNoGradEvidence};
pub use super::no_history::NoHistoryEvidence;
pub use super::oom::OomEvidence;
pub use super::optimizer::OptimizerStateEvidence;
pub use super::outside::{LikelyWorkspace, OutsideAllocatorEvidence, Range, Workspace};
pub use super::peak::PeakEvidence;
pub use super::pools::{Pool, PrivatePoolsEvidence};
pub use super::retained::RetainedGraphEvidence;
pub use super::steps::IterationsEvidence;
pub use super::temporaries::TemporariesEvidence;
pub use super::truncated::TruncatedTraceEvidence;
use super::{Live, StackBytes, Verified};

/// The enum of the kinds' types.
macro_rules! evidence {
    ($($variant:ident($ty:ty) = $kind:ident),+ $(,)?) => {
        /// A finding's evidence: its kind's type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Evidence {
            $($variant($ty)),+
        }

        $(impl From<$ty> for Evidence {
            fn from(evidence: $ty) -> Evidence {
                Evidence::$variant(evidence)
            }
        })+

        impl Evidence {
            /// The finding kind this is the evidence of.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Evidence::$variant(_) => super::$kind),+
                }
            }

            /// As `doctor --json` writes it: the type alone (the finding names its kind), its
            /// keys sorted (as they have always been written).
            pub fn json(&self) -> Value {
                let json = match self {
                    $(Evidence::$variant(e) => serde_json::to_value(e)),+
                };
                json.unwrap_or_default()
            }

            /// `kind`'s evidence read from its JSON.
            pub fn from_json(kind: &str, json: Value) -> Result<Evidence, String> {
                $(if kind == super::$kind {
                    return serde_json::from_value(json).map(Evidence::$variant).map_err(|e| format!("{kind}'s evidence: {e}"));
                })+
                Err(format!("no finding kind is named {kind:?}"))
            }
        }
    };
}

evidence! {
    Peak(PeakEvidence) = PEAK,
    NoHistory(NoHistoryEvidence) = NO_HISTORY,
    Oom(OomEvidence) = OOM,
    TruncatedTrace(TruncatedTraceEvidence) = TRUNCATED_TRACE,
    Fragmentation(FragmentationEvidence) = FRAGMENTATION,
    Growth(GrowthEvidence) = GROWTH,
    RetainedGraph(RetainedGraphEvidence) = RETAINED_GRAPH,
    MissingNoGrad(MissingNoGradEvidence) = MISSING_NO_GRAD,
    GradsKept(GradsKeptEvidence) = GRADS_KEPT,
    OptimizerState(OptimizerStateEvidence) = OPTIMIZER_STATE,
    PrivatePools(PrivatePoolsEvidence) = PRIVATE_POOLS,
    KeptActivations(KeptActivationsEvidence) = KEPT_ACTIVATIONS,
    Temporaries(TemporariesEvidence) = TEMPORARIES,
    Copies(CopiesEvidence) = COPIES,
    Intermediates(IntermediatesEvidence) = INTERMEDIATES,
    OutsideAllocator(OutsideAllocatorEvidence) = OUTSIDE_ALLOCATOR,
}

impl Evidence {
    // `live` and `top_stacks` name every kind (no `_` arm): a new kind must say what it has.

    /// What was live at the moment the finding is about (the peak, the failed request).
    pub fn live(&self) -> Option<&Live> {
        match self {
            Evidence::Peak(e) => Some(&e.live),
            Evidence::Oom(e) => Some(&e.live),
            Evidence::NoHistory(_)
            | Evidence::TruncatedTrace(_)
            | Evidence::Fragmentation(_)
            | Evidence::Growth(_)
            | Evidence::RetainedGraph(_)
            | Evidence::MissingNoGrad(_)
            | Evidence::GradsKept(_)
            | Evidence::OptimizerState(_)
            | Evidence::PrivatePools(_)
            | Evidence::KeptActivations(_)
            | Evidence::Temporaries(_)
            | Evidence::Copies(_)
            | Evidence::Intermediates(_)
            | Evidence::OutsideAllocator(_) => None,
        }
    }

    /// The stacks holding the bytes the finding names (or, for the peak and an oom, what was
    /// live), most first.
    pub fn top_stacks(&self) -> &[StackBytes] {
        match self {
            Evidence::Growth(e) => &e.top_stacks,
            Evidence::RetainedGraph(e) => &e.top_stacks,
            Evidence::MissingNoGrad(e) => &e.top_stacks,
            Evidence::GradsKept(e) => &e.top_stacks,
            Evidence::OptimizerState(e) => &e.top_stacks,
            Evidence::KeptActivations(e) => &e.top_stacks,
            Evidence::Temporaries(e) => &e.top_stacks,
            Evidence::Copies(e) => &e.top_stacks,
            Evidence::Peak(PeakEvidence { live, .. }) | Evidence::Oom(OomEvidence { live, .. }) => &live.top_stacks,
            Evidence::NoHistory(_)
            | Evidence::TruncatedTrace(_)
            | Evidence::Fragmentation(_)
            | Evidence::PrivatePools(_)
            | Evidence::Intermediates(_)
            | Evidence::OutsideAllocator(_) => &[],
        }
    }

    /// The allocator settings tried by replay, each with its figures.
    pub fn what_ifs(&self) -> &[Verified] {
        match self {
            Evidence::Fragmentation(e) => &e.what_ifs,
            _ => &[],
        }
    }
}

impl serde::Serialize for Evidence {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json().serialize(serializer)
    }
}
