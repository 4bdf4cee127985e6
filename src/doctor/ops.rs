//! The operation that made each allocation, read from its stack, for the findings about single
//! expressions (`temporaries`, `copies`, `intermediates`). tensormem's stacks name the op at its
//! Rust call site (`clone (scenarios/seeds.rs:151)`, `mm (MmBackward0)`); PyTorch's C++ frames
//! name it at ATen's dispatcher entry (`at::_ops::clone::call(...)`), under the helpers that
//! obtain the memory (`empty_strided`, `resize_`), which are skipped when an op called them.
//! Python-only stacks name no op.

use crate::timeline::Timeline;

/// What an op's allocation is, for these findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpKind {
    /// A tensor the program asked for (`randn`, `zeros`, `empty`...): data, not an intermediate.
    Factory,
    /// A copy of a tensor's data in another layout (`clone`, `contiguous`, a reshape that no
    /// strides express, `repeat`): what a view would have avoided.
    Copy,
    /// A dtype or device conversion (`.to()`, autocast's casts).
    Cast,
    /// Any other op's output (or workspace).
    Output,
}

/// The ops each stack names (index: the timeline's stack id).
pub(super) struct Ops {
    names: Vec<Option<String>>,
}

/// ATen ops that obtain memory for the op above them.
const PLUMBING: [&str; 7] = ["empty_strided", "empty_memory_format", "empty", "empty_like", "new_empty", "new_empty_strided", "resize_"];
const COPIES: [&str; 5] = ["clone", "contiguous", "repeat", "_reshape_copy", "expand_copy"];
const CASTS: [&str; 3] = ["to", "_to_copy", "_to_dtype"];
const FACTORIES: [&str; 22] = [
    "randn",
    "rand",
    "randint",
    "randperm",
    "normal",
    "normal_",
    "uniform_",
    "zeros",
    "ones",
    "full",
    "arange",
    "linspace",
    "eye",
    "tensor",
    "scalar_tensor",
    "from_slice",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
    "empty_like",
];

impl Ops {
    pub fn new(t: &Timeline) -> Ops {
        let stacks = t.stack_offsets.len().saturating_sub(1);
        let names = (0..stacks)
            .map(|s| {
                let ids = &t.stack_frames[t.stack_offsets[s] as usize..t.stack_offsets[s + 1] as usize];
                op_name(ids.iter().map(|&f| (t.frames[f as usize].name.as_str(), t.frames[f as usize].filename.as_str())))
            })
            .collect();
        Ops { names }
    }

    /// The op that made allocation `id` (None: its stack names none).
    pub fn name(&self, t: &Timeline, id: usize) -> Option<&str> {
        self.names.get(t.allocations.stack[id] as usize).and_then(|n| n.as_deref())
    }

    pub fn kind(&self, t: &Timeline, id: usize) -> Option<OpKind> {
        self.name(t, id).map(kind_of)
    }

    /// When the stacks have frames but none names an op (PyTorch's `stacks="python"`), what the
    /// findings that need the op cannot say, once.
    pub fn unreadable_note(&self, t: &Timeline) -> Option<String> {
        let framed = t.frames.iter().any(|f| f.filename.ends_with(".py"));
        (framed && self.names.iter().all(Option::is_none)).then(|| {
            "The stacks are Python frames only (recorded with stacks=\"python\"): they name no op, so copies (clone, \
             contiguous), the temporaries an op makes for itself and the peak by op cannot be told. Record with torch.cuda.memory._record_memory_history(stacks=\"all\") (the \
             default) to have them."
                .to_string()
        })
    }
}

/// The op in a stack of (name, file) frames, innermost first.
fn op_name<'a>(frames: impl Iterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let mut plumbing = None;
    for (name, file) in frames {
        if file.ends_with(".rs") {
            // tensormem: the first frame is the op; a backward op names its node after a space.
            return name.split(' ').next().filter(|n| !n.is_empty()).map(str::to_string);
        }
        if let Some(op) = name.strip_prefix("at::_ops::").and_then(|rest| rest.split("::").next()) {
            if !PLUMBING.contains(&op) {
                return Some(op.to_string());
            }
            plumbing.get_or_insert_with(|| op.to_string());
        }
    }
    plumbing
}

fn kind_of(op: &str) -> OpKind {
    if COPIES.contains(&op) {
        OpKind::Copy
    } else if CASTS.contains(&op) {
        OpKind::Cast
    } else if FACTORIES.contains(&op) || PLUMBING.contains(&op) {
        OpKind::Factory
    } else {
        OpKind::Output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(frames: &[(&str, &str)]) -> Option<String> {
        op_name(frames.iter().copied())
    }

    #[test]
    fn reads_the_op_from_either_kind_of_stack() {
        assert_eq!(op(&[("clone", "src/scenarios/seeds.rs"), ("main", "src/main.rs")]).as_deref(), Some("clone"));
        assert_eq!(op(&[("mm (MmBackward0)", "src/autograd/engine.rs")]).as_deref(), Some("mm"));
        // PyTorch: the allocator's frames, then the helper that obtained the memory, then the op.
        let pytorch = [
            ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", ""),
            ("at::_ops::empty_strided::call(...)", ""),
            ("at::_ops::clone::call(at::Tensor const&, std::optional<c10::MemoryFormat>)", ""),
            ("at::_ops::contiguous::call(...)", ""),
            ("forward", "model.py"),
        ];
        assert_eq!(op(&pytorch).as_deref(), Some("clone"));
        assert_eq!(op(&pytorch[..2]).as_deref(), Some("empty_strided"));
        assert_eq!(op(&[("forward", "model.py")]), None);
        assert_eq!(kind_of("clone"), OpKind::Copy);
        assert_eq!(kind_of("_to_copy"), OpKind::Cast);
        assert_eq!(kind_of("empty_strided"), OpKind::Factory);
        assert_eq!(kind_of("mul_Tensor"), OpKind::Output);
    }
}
