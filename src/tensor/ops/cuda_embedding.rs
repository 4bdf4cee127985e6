//! What PyTorch's CUDA embedding backward (`embedding_dense_backward_cuda` in `Embedding.cu`,
//! `embedding_backward_cuda_kernel` in `EmbeddingBackwardKernel.cu`) takes from the caching
//! allocator besides its result. Past 3072 ids it sorts them with CUB, finds the runs of equal
//! ids and sums each run's rows in partial segments of 10 rows, all in scratch sized by the ids'
//! count (PyTorch 2.11 sizes every buffer for the worst case, so nothing depends on the ids'
//! values); CUB's own temporary storage comes from the caching allocator too, as odd sizes such as
//! 150,015 bytes for 8192 ids.
//!
//! CUB's sizes are those of CCCL 3.0.1 (CUDA 13.0) with its sm_90 tunings, checked against the
//! H100 recordings (8192 and 4096 ids); another architecture's tunings move them by a few KiB.

/// Ids at most this many (without `scale_grad_by_freq`) are summed without sorting: the result
/// is the only allocation.
pub(crate) const UNSORTED_IDS: usize = 3072;

/// Rows per partial segment (`NROWS_PER_THREAD`).
const ROWS_PER_PARTIAL_SEGMENT: usize = 10;

/// CUB's `AliasTemporaries`: each buffer rounded up to 256 bytes, plus 255 to align the base.
fn alias_temporaries(sizes: &[u64]) -> u64 {
    sizes.iter().map(|s| s.next_multiple_of(256)).sum::<u64>() + 255
}

/// `DeviceRadixSort::SortPairs` of `n` ids with their positions (keys and values of `id_bytes`,
/// all 64 bits sorted: ATen leaves `end_bit` at its default): onesweep, 8 passes of 8 bits,
/// 4608 keys per tile; up to 2304 keys one tile, which asks for 1 byte.
pub(crate) fn radix_sort_pairs_temp(n: u64, id_bytes: u64) -> u64 {
    const TILE: u64 = 384 * 12;
    const SINGLE_TILE: u64 = 256 * 9;
    const PASSES: u64 = 64 / 8;
    const PORTION: u64 = ((1 << 28) - 1) / TILE * TILE;
    if n <= SINGLE_TILE {
        return 1;
    }
    let portions = n.div_ceil(PORTION);
    let bins = portions * PASSES * 256 * 8;
    let lookback = n.min(PORTION).div_ceil(TILE) * 256 * 4;
    let counters = portions * PASSES * 4;
    alias_temporaries(&[bins, lookback, n * id_bytes, n * id_bytes, counters])
}

/// A single-pass scan's temporary storage (`ScanTileState` of 16-byte words, 32 padding
/// states, itself aliased once inside and once outside).
fn single_pass_temp(n: u64, tile: u64) -> u64 {
    let tile_state = alias_temporaries(&[(n.div_ceil(tile) + 32) * 16]);
    alias_temporaries(&[tile_state])
}

/// `DeviceSelect::UniqueByKey` over `n` sorted ids (4480 per tile).
pub(crate) fn unique_by_key_temp(n: u64) -> u64 {
    single_pass_temp(n, 640 * 7)
}

/// `DeviceScan::ExclusiveSum` of `n` ids (ATen's own sum operator takes CUB's default tuning,
/// 896 per tile; ATen splits scans only past 2^30 items).
pub(crate) fn exclusive_sum_temp(n: u64) -> u64 {
    single_pass_temp(n.min(1 << 30), 128 * 7)
}

/// The scratch buffers' lengths in elements, for `ids` ids into a table of `rows` rows.
pub(crate) struct SegmentScratch {
    /// `min(ids, rows)`: at most one segment per distinct id.
    pub max_segments: usize,
    /// Partial segments of 10 rows: `ids / 10 + max_segments`.
    pub max_partial_segments: usize,
}

impl SegmentScratch {
    pub(crate) fn new(ids: usize, rows: usize) -> SegmentScratch {
        let max_segments = ids.min(rows);
        SegmentScratch { max_segments, max_partial_segments: ids / ROWS_PER_PARTIAL_SEGMENT + max_segments }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes the H100 recordings show (gpt2-train: 8192 ids of a 50,257-row table;
    /// gpt2-train-ctx512 and grad-accumulation: 4096 ids of 50,257 and of 1000 rows).
    #[test]
    fn cub_asks_what_the_h100_recordings_show() {
        assert_eq!(radix_sort_pairs_temp(8192, 8), 150_015);
        assert_eq!(radix_sort_pairs_temp(4096, 8), 83_455);
        assert_eq!(radix_sort_pairs_temp(2304, 8), 1);
        for n in [4096, 8192] {
            assert_eq!(unique_by_key_temp(n), 1279);
            assert_eq!(exclusive_sum_temp(n), 1279);
        }
        // Past 16 tiles the tile states take another 256 bytes.
        assert_eq!(exclusive_sum_temp(16 * 896), 1279);
        assert_eq!(exclusive_sum_temp(16 * 896 + 1), 1535);
        let s = SegmentScratch::new(8192, 50_257);
        assert_eq!((s.max_segments, s.max_partial_segments), (8192, 9011));
        assert_eq!(SegmentScratch::new(4096, 1000).max_partial_segments, 1409);
    }
}
