//! The kind each scenario teaches, for tests/doctor_scenarios.rs (tensormem's own traces) and
//! tests/doctor_corpus.rs (PyTorch's traces of the same programs, the H100 twins).

use tensormem::doctor;

/// The kind each scenario teaches. `loss-history` teaches `growth`: with backward each step, the
/// graph's saved tensors are freed by backward and what the kept loss tensors hold on the card
/// is one 512-byte block per step (the graph's nodes are host memory), so the trace shows
/// growth, not a retained graph of any size (`retained-graph` waits for 4 KiB). The seeds show
/// single expressions: `seed-basics`' batched matmul copies its permuted operand (`copies`),
/// `broadcast-temporaries`' mistake materialises a broadcast (`copies`), `inplace-chain`'s
/// keeps the old x while x + 1 is made (`temporaries`); `intermediates` has no problem, and the
/// doctor says what its peak is made of (`intermediates`, information, after the peak).
pub const TAUGHT: [(&str, &str); 14] = [
    ("variable-batch", doctor::FRAGMENTATION),
    ("eval-no-grad", doctor::MISSING_NO_GRAD),
    ("loss-history", doctor::GROWTH),
    ("zero-grad", doctor::GRADS_KEPT),
    ("grad-fn-history", doctor::RETAINED_GRAPH),
    ("rnn-hidden", doctor::RETAINED_GRAPH),
    ("cached-graph", doctor::RETAINED_GRAPH),
    ("optimizer-state", doctor::OPTIMIZER_STATE),
    ("seed-basics", doctor::COPIES),
    ("intermediates", doctor::INTERMEDIATES),
    ("views-vs-copies", doctor::COPIES),
    ("inplace-chain", doctor::TEMPORARIES),
    ("broadcast-temporaries", doctor::COPIES),
    ("oom", doctor::OOM),
];

/// Kinds read from the op that made each allocation: a trace with Python stacks only cannot
/// show them (the twins are recorded so).
pub const NEED_THE_OP: [&str; 3] = [doctor::COPIES, doctor::TEMPORARIES, doctor::INTERMEDIATES];
