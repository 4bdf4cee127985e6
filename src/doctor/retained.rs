//! `retained-graph`: a graph a forward made (what it saved for backward) still live when a
//! later iteration starts: after its backward (`retain_graph=True`, a hidden state not
//! detached, a result cached on the module), or, in a loop that never calls backward, two
//! iterations later (the graph kept past the next step, not just until its replacement).
//!
//! The counterfactual: after a backward (without retain_graph) the graph's saved tensors are
//! freed, and under no_grad there is no graph at all, so what a correct program still holds of
//! an earlier forward is a result it keeps (the last logits until `logits` is rebound), made at
//! the forward's end. A claim needs what only a graph keeps: tensors of the forward's earlier
//! layers, at least a quarter of them (`steps::graph_kept_at`), or an input the program let go
//! of, kept until the held tensor dies and freed with it (saved by that tensor's graph). A
//! tensor freed by the next iteration's backward is a state carried into the new graph (a
//! detached hidden state): the new graph uses it. Nor is a key/value cache in a loop without
//! backward: generation keeps it on purpose. A result kept across steps without a graph is
//! `growth`'s to report when it accumulates.
//!
//! The figures replay the trace with each retained tensor freed where its graph would have died:
//! as its own iteration's backward ends (in a loop without backward, once the next op has read
//! it). On the H100 twin of an RNN whose hidden state is never detached, that comes within 3% of
//! the peak its fix recorded.

use super::Material;
use super::kinds::{Kind, Role};
use super::steps::{self, Phase, Steps};
use super::{AllocationRef, Finding, Patient, RETAINED_GRAPH, StackBytes, size, what_if};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetainedGraphEvidence {
    #[serde(flatten)]
    pub iterations: steps::IterationsEvidence,
    /// Whether the trace has a backward pass (else the graphs are never used).
    pub backward: bool,
    /// At each iteration's start (from the second): the bytes of earlier forwards still live.
    pub retained_per_iteration: Vec<u64>,
    /// The iteration where the most is retained, and its start position.
    pub worst_iteration: usize,
    pub position: u32,
    /// The iterations the retained tensors were made in.
    pub made_in_iterations: Vec<usize>,
    pub top_stacks: Vec<StackBytes>,
    pub allocations: Vec<AllocationRef>,
}

/// Retained bytes worth reporting: this share of the peak...
/// ...and at least this many bytes (a kept 0-d loss, 512 bytes a step, is `growth`'s to report).
pub(super) const KIND: Kind = Kind {
    name: RETAINED_GRAPH,
    label: "retained graph",
    about: "forward tensors alive past their backward",
    role: Role::Problem,
    find: |x| Ok(find(&x.patient, &x.steps)),
    material: Material { share: 0.005, min_bytes: 4096 },
};

pub(super) fn find(p: &Patient, s: &Steps) -> Option<Finding> {
    let n = s.iterations.len();
    if n < 2 {
        return None;
    }
    let a = &p.timeline.allocations;
    let forward: Vec<usize> =
        s.order.iter().copied().filter(|&id| s.forward_made(p, id) && !s.made_once[id] && (s.has_backward || !steps::is_kv_cache(p, id))).collect();
    let events = p.timeline.events;
    // Each iteration's backward: from its first backward allocation to the next pass.
    let backward: Vec<Option<(u32, u32)>> = (0..=n)
        .map(|k| {
            let (b, end) = (*s.iterations.get(k.checked_sub(1)?)?, s.iteration_end(k, events));
            let i = s.passes.partition_point(|q| q.first < b);
            let i = i + s.passes[i..].iter().take_while(|q| q.first < end).position(|q| q.phase == Phase::Backward)?;
            Some((s.passes[i].first, s.passes.get(i + 1).map_or(end, |q| q.first)))
        })
        .collect();
    let mut by_iteration: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    for &id in &forward {
        by_iteration[s.iteration_of(a.start[id])].push(id);
    }
    // Each forward's inputs: what the program made outside any forward since the one before
    // (`x = torch.randn(...)`), by the forward they feed (`feeds`: by allocation id, 0 for none).
    let mut inputs: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    let mut feeds = vec![0usize; a.start.len()];
    for &id in &s.order {
        let i = s.iteration_of(a.start[id]) + 1;
        if i <= n && a.start[id] > 0 && s.phase[id].is_none() && !s.forward_made(p, id) {
            inputs[i].push(id);
            feeds[id] = i;
        }
    }
    // Freed one after the other, nothing allocated between, while the loop still runs (what a
    // program frees as it ends, its model with the rest, says nothing of a graph).
    let last_start = *s.iterations.last().unwrap();
    let freed_together = |x: usize, y: usize| a.end[x].max(a.end[y]) < last_start && steps::nothing_allocated_between(p, s, a.end[x], a.end[y]);
    // An input of forward `i` freed with a tensor of `i` live at `b`: saved by that tensor's graph.
    let kept_by_graph = |x: usize, i: usize, b: u32| by_iteration[i].iter().any(|&r| steps::live_at(p, r, b) && freed_together(x, r));
    // Whether what forward `i` still holds at position `b` is a graph rather than a result the
    // program holds: tensors of its earlier layers (`graph_kept_at`), or an input the program let
    // go of, kept until the held tensor dies and freed with it. Read once per (i, b).
    let mut graph_at: rustc_hash::FxHashMap<(usize, u32), bool> = Default::default();
    let mut graph = |i: usize, b: u32| {
        *graph_at
            .entry((i, b))
            .or_insert_with(|| steps::graph_kept_at(p, &by_iteration[i], b) || inputs[i].iter().any(|&x| steps::live_at(p, x, b) && kept_by_graph(x, i, b)))
    };
    let mut candidates: Vec<usize> = forward.iter().copied().chain(inputs.iter().flatten().copied()).collect();
    candidates.sort_by_key(|&id| (a.start[id], id));
    let (per_iteration, (bytes, k, retained)) = s.worst_iteration(p, &candidates, |k, b, id| {
        let i = if feeds[id] > 0 { feeds[id] } else { s.iteration_of(a.start[id]) };
        let old_enough = if s.has_backward { i >= 1 && i < k } else { i >= 1 && i + 2 <= k };
        let carried = backward[k].is_some_and(|(from, to)| a.end[id] > from && a.end[id] <= to);
        old_enough && !carried && graph(i, b) && (feeds[id] == 0 || kept_by_graph(id, i, b))
    });
    if !s.material(p, bytes, KIND.material) {
        return None;
    }
    let mut made_in: Vec<usize> = retained.iter().map(|&id| s.iteration_of(a.start[id])).collect();
    made_in.sort_unstable();
    made_in.dedup();
    let top_stacks = steps::top_stacks(p, &retained, 3);
    let keeper = top_stacks.first().and_then(|s| s.frames.first().cloned()).unwrap_or_else(|| "allocations without a stack".into());
    let title = if s.has_backward {
        format!("{} of earlier iterations' forward outlive their backward: iteration {k} starts with them still live ({keeper})", size(bytes))
    } else {
        format!("{} of graphs from {} earlier iterations are still live at iteration {k}, with no backward to use them ({keeper})", size(bytes), made_in.len())
    };
    let why = format!(
        "A tensor the forward made stays allocated as long as something refers to it: a list of losses or outputs, a cache \
         on the module, a hidden state passed to the next batch without detach(), backward(retain_graph=True) keeping \
         the graph, or a variable (out, loss) still holding the last step's result while the next forward runs. Through its grad_fn a kept output also keeps everything its graph saved for backward. Here {} from \
         iteration{} {} is live when iteration {k} starts.",
        size(bytes),
        if made_in.len() > 1 { "s" } else { "" },
        made_in.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    );
    let fix = "Keep numbers or detached tensors across steps: losses.append(loss.item()), hidden = hidden.detach() at each batch \
               start (and drop retain_graph=True), do not cache forward results on the module (or cache result.detach()); \
               a loop that never calls backward runs under torch.no_grad(); `del out, loss` after optimizer.step() frees \
               the last step's results before the next forward."
        .to_string();
    let evidence = RetainedGraphEvidence {
        iterations: s.evidence(p),
        backward: s.has_backward,
        retained_per_iteration: per_iteration,
        worst_iteration: k,
        position: s.iterations[k - 1],
        made_in_iterations: made_in,
        allocations: steps::largest(p, &retained, 5),
        top_stacks,
    };
    // The fix's figures: each retained tensor freed where its graph would have died, as its own
    // iteration's backward ends (under no_grad, in a loop without one, once the next op has read it).
    let sooner: Vec<(usize, usize)> = retained
        .iter()
        .filter_map(|&id| {
            let i = if feeds[id] > 0 { feeds[id] } else { s.iteration_of(a.start[id]) };
            let after = match s.has_backward {
                true => steps::allocation_before(p, s, backward[i]?.1)?,
                false => steps::allocation_after(p, s, a.start[id], |_| true)?,
            };
            Some((steps::trace_index(p, id)?, after))
        })
        .collect();
    let how = match s.has_backward {
        true => "replay the trace with each retained tensor freed as its own iteration's backward ends, as without the reference that keeps it",
        false => "replay the trace with each retained tensor freed once the next op has read it, as under torch.no_grad()",
    };
    Some(Finding::new(title, bytes, evidence, why, fix).verified(what_if::freed_sooner(p, &sooner, how)))
}
