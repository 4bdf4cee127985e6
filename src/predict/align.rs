//! Aligning two recordings' events: the longest common subsequence of their keys (the action
//! and the stack), by Myers' O((N+M)D) difference algorithm after the common prefix and suffix
//! are set aside. Recordings of one program at two sizes differ in few places (D small); where
//! they differ in more than [`MAX_DIFFERENCES`], the rest stays unaligned.

/// Edits (events of one recording missing from the other) searched at most; memory grows as its
/// square.
pub const MAX_DIFFERENCES: usize = 4000;

/// Marks an event with no counterpart.
pub const NONE: u32 = u32::MAX;

/// For each event of `a`, the index of its counterpart in `b` (or [`NONE`]); counterparts
/// keep their order.
pub fn align(a: &[u64], b: &[u64]) -> Vec<u32> {
    let mut matched = vec![NONE; a.len()];
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    for (i, m) in matched.iter_mut().enumerate().take(prefix) {
        *m = i as u32;
    }
    let (a_rest, b_rest) = (&a[prefix..], &b[prefix..]);
    let suffix = a_rest.iter().rev().zip(b_rest.iter().rev()).take_while(|(x, y)| x == y).count();
    for k in 0..suffix {
        matched[a.len() - 1 - k] = (b.len() - 1 - k) as u32;
    }
    let a_mid = &a_rest[..a_rest.len() - suffix];
    let b_mid = &b_rest[..b_rest.len() - suffix];
    for (i, j) in myers(a_mid, b_mid) {
        matched[prefix + i] = (prefix + j) as u32;
    }
    matched
}

/// [`align`] by the `fine` keys, then each stretch left between two matched events aligned by
/// the `coarse` keys (which tell fewer events apart).
pub fn align_refined(fine: (&[u64], &[u64]), coarse: (&[u64], &[u64])) -> Vec<u32> {
    let mut matched = align(fine.0, fine.1);
    // The gaps: from after one matched pair to before the next (or the ends).
    let mut gaps = Vec::new();
    let (mut from_a, mut from_b) = (0usize, 0usize);
    for (i, &j) in matched.iter().enumerate() {
        if j != NONE {
            gaps.push((from_a..i, from_b..j as usize));
            (from_a, from_b) = (i + 1, j as usize + 1);
        }
    }
    gaps.push((from_a..fine.0.len(), from_b..fine.1.len()));
    for (ga, gb) in gaps.into_iter().filter(|(ga, gb)| !ga.is_empty() && !gb.is_empty()) {
        for (i, j) in align(&coarse.0[ga.clone()], &coarse.1[gb.clone()]).into_iter().enumerate().filter(|(_, j)| *j != NONE) {
            matched[ga.start + i] = (gb.start + j as usize) as u32;
        }
    }
    matched
}

/// The matched pairs of a shortest edit script between `a` and `b` (none when it would take
/// more than [`MAX_DIFFERENCES`] edits).
fn myers(a: &[u64], b: &[u64]) -> Vec<(usize, usize)> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    if n == 0 || m == 0 {
        return Vec::new();
    }
    let max = (n + m) as usize;
    let limit = max.min(MAX_DIFFERENCES);
    let offset = limit as isize + 1;
    let mut v = vec![0isize; 2 * limit + 3];
    // v as it was before each round d, over k in -(d+1)..=d+1.
    let mut history: Vec<Vec<isize>> = Vec::new();
    let mut end = None;
    'rounds: for d in 0..=limit as isize {
        history.push(v[(offset - d - 1) as usize..=(offset + d + 1) as usize].to_vec());
        let mut k = -d;
        while k <= d {
            let at = |k: isize| (offset + k) as usize;
            let mut x = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) { v[at(k + 1)] } else { v[at(k - 1)] + 1 };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[at(k)] = x;
            if x >= n && y >= m {
                end = Some(d);
                break 'rounds;
            }
            k += 2;
        }
    }
    let Some(d_end) = end else { return Vec::new() };
    let mut pairs = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (0..=d_end).rev() {
        let saved = &history[d as usize];
        let get = |k: isize| saved[(k + d + 1) as usize];
        let k = x - y;
        let prev_k = if k == -d || (k != d && get(k - 1) < get(k + 1)) { k + 1 } else { k - 1 };
        let prev_x = get(prev_k);
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            x -= 1;
            y -= 1;
            pairs.push((x as usize, y as usize));
        }
        if d > 0 {
            (x, y) = (prev_x, prev_y);
        }
    }
    pairs.reverse();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcs_len(a: &[u64], b: &[u64]) -> usize {
        let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 0..a.len() {
            for j in 0..b.len() {
                t[i + 1][j + 1] = if a[i] == b[j] { t[i][j] + 1 } else { t[i][j + 1].max(t[i + 1][j]) };
            }
        }
        t[a.len()][b.len()]
    }

    fn check(a: &[u64], b: &[u64]) {
        let m = align(a, b);
        let pairs: Vec<(usize, usize)> = m.iter().enumerate().filter(|(_, j)| **j != NONE).map(|(i, &j)| (i, j as usize)).collect();
        for w in pairs.windows(2) {
            assert!(w[0].1 < w[1].1, "order kept");
        }
        for &(i, j) in &pairs {
            assert_eq!(a[i], b[j]);
        }
        assert_eq!(pairs.len(), lcs_len(a, b), "{a:?} {b:?}");
    }

    #[test]
    fn refined_alignment_anchors_on_fine_keys_and_fills_the_gaps_by_coarse_ones() {
        // Fine keys: 100 and 200 are sizes that match (anchors); 7x are sizes that differ
        // between the two. Coarse keys know all of them as 1.
        let a = [5, 100, 71, 72, 200, 73, 6];
        let b = [5, 100, 81, 200, 83, 84, 6];
        let coarse = |k: &[u64]| k.iter().map(|&x| if x == 5 || x == 6 { x } else { 1 }).collect::<Vec<_>>();
        let m = align_refined((&a, &b), (&coarse(&a), &coarse(&b)));
        // 71 pairs with 81 (72 has none: the gap has one on b's side), 73 with 83.
        assert_eq!(m, [0, 1, 2, NONE, 3, 4, 6]);
        // By coarse keys alone every event pairs by order, 200 with 83.
        assert_eq!(align(&coarse(&a), &coarse(&b)), [0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn aligns_as_a_longest_common_subsequence() {
        check(&[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5]);
        check(&[1, 2, 3, 4, 5], &[1, 3, 4, 9, 5]);
        check(&[7, 1, 2, 3], &[1, 2, 3, 8]);
        check(&[], &[1, 2]);
        check(&[1, 2, 1, 2, 3, 1], &[2, 1, 3, 1, 2, 2, 1]);
        // A pseudo-random pair.
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % 4
        };
        for _ in 0..50 {
            let a: Vec<u64> = (0..30).map(|_| next()).collect();
            let b: Vec<u64> = (0..25).map(|_| next()).collect();
            check(&a, &b);
        }
    }
}
