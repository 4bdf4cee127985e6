//! `torch.distributed.optim.ZeroRedundancyOptimizer`'s partition: each parameter's optimizer
//! state lives on one rank. After its local step each rank broadcasts the parameters it owns
//! (in place: nothing allocated).

/// `_partition_parameters`: the parameters by size, largest first (a stable sort: equal sizes
/// keep their order), each given to the rank holding the fewest elements so far (the lowest
/// such rank on a tie). Returns, per rank, the indices of its parameters in the order its local
/// optimizer holds them.
pub fn partition_parameters(numels: &[usize], world: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..numels.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(numels[i]));
    // u64: a rank's total passes 2^32 elements in a 70B model (usize is 32 bits in wasm).
    let mut sizes = vec![0u64; world];
    let mut ranks = vec![Vec::new(); world];
    for i in order {
        let rank = (0..world).min_by_key(|&r| (sizes[r], r)).expect("world >= 1");
        sizes[rank] += numels[i] as u64;
        ranks[rank].push(i);
    }
    ranks
}
