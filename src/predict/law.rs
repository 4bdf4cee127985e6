//! How one allocation's requested size depends on the variables: a sum of monomials (constant,
//! `context`, `context^2`, `batch*context^2`, ...), fitted to the sizes the recordings hold.
//!
//! Sizes are products of shapes and an element size, so the law sought is the simplest one that
//! reproduces every recording exactly with integer coefficients: fewest terms first, then lowest
//! degree. Only where no such law exists does a law with fractional coefficients stand (its
//! prediction rounded up), marked inexact.

use rustc_hash::FxHashMap;
use serde::Serialize;

/// Each variable's exponent goes up to this, and so does a monomial's total degree.
const MAX_DEGREE: u32 = 3;
/// A law has at most this many terms (and never more than the recordings have distinct points).
const MAX_TERMS: usize = 3;

/// Block sizes tried for a ceil division (`ceil(context/128)`): powers of two, as kernels tile.
const BLOCKS: [i128; 11] = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048];

/// A fitted law over the free variables (their order is the predictor's).
#[derive(Debug, Clone, PartialEq)]
pub struct Law {
    /// (coefficient, exponent per free variable).
    pub terms: Vec<(Coefficient, Vec<u32>)>,
    /// Per free variable, the block it is counted in: the law reads `ceil(x / block)` (1: x).
    /// A kernel that tiles a dimension allocates per block begun.
    pub blocks: Vec<i128>,
    /// How the law was found.
    pub basis: Basis,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Coefficient {
    Integer(i128),
    /// No integer law reproduces the recordings; this one does within half a byte.
    Fraction(f64),
}

/// What a law rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// Reproduces every recording exactly.
    Fitted,
    /// Inferred from one recording's size: the variables whose values divide it (weak).
    Factors,
    /// The recordings disagree with every law tried: the size of the recording nearest the
    /// target stands, unscaled.
    Unfitted,
    /// No counterpart in every recording: the nearest recording's size stands, unscaled.
    Unaligned,
    /// No counterpart in every recording: the law of an aligned allocation of the same stack
    /// and the same size in the nearest recording, else its stack's growth scaled to its size.
    Neighbour,
}

/// What a predicted size rests on, from most to least sure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sureness {
    /// A law that a recording checks beyond those that determine it.
    Checked,
    /// A law that only passes through the recordings (or a guess from one recording's factors).
    Extrapolated,
    /// No law: the nearest recording's size stands.
    RecordedSize,
}

impl Law {
    pub fn constant(size: u64, basis: Basis, variables: usize) -> Law {
        Law { terms: vec![(Coefficient::Integer(size as i128), vec![0; variables])], blocks: vec![1; variables], basis }
    }

    /// The size at `x` (values of the free variables), rounded up to a whole byte; at least 1.
    pub fn eval(&self, x: &[i128]) -> u64 {
        self.value(x).clamp(1, u64::MAX as i128) as u64
    }

    /// The law's value at `x`, rounded up to a whole byte, unclamped: below 0 where the law
    /// goes negative (a size falling as a variable grows, extrapolated past zero).
    pub fn value(&self, x: &[i128]) -> i128 {
        // Counted in blocks only where the law has one (most have none: no copy per call).
        let counted;
        let x = if self.blocks.iter().all(|&b| b == 1) {
            x
        } else {
            counted = in_blocks(x, &self.blocks);
            &counted
        };
        let mut exact: i128 = 0;
        let mut fraction = 0.0;
        for (c, powers) in &self.terms {
            let m = monomial(x, powers);
            match c {
                Coefficient::Integer(c) => exact = exact.saturating_add(c.saturating_mul(m)),
                Coefficient::Fraction(c) => fraction += c * m as f64,
            }
        }
        let total = exact as f64 + fraction;
        if fraction == 0.0 { exact } else { total.ceil() as i128 }
    }

    /// How far the law is to be trusted, given how many distinct points the recordings give:
    /// a law with integer coefficients and fewer terms than points is checked by a recording
    /// beyond those that determine it (a constant seen twice, `4096*context` through two
    /// contexts); one with as many terms as points only passes through them.
    pub fn sureness(&self, points: usize) -> Sureness {
        let integer = self.terms.iter().all(|(c, _)| matches!(c, Coefficient::Integer(_)));
        match self.basis {
            Basis::Fitted if integer && self.terms.len() < points => Sureness::Checked,
            Basis::Fitted | Basis::Factors | Basis::Neighbour => Sureness::Extrapolated,
            Basis::Unfitted | Basis::Unaligned => Sureness::RecordedSize,
        }
    }

    /// `size` at `x` growing as the monomial `powers`: the one-term law through it, if the
    /// monomial's value at `x` divides it.
    pub fn scaled(size: u64, powers: &[u32], x: &[i128], basis: Basis) -> Option<Law> {
        let m = monomial(x, powers);
        (m > 0 && size as i128 % m == 0).then(|| Law {
            terms: vec![(Coefficient::Integer(size as i128 / m), powers.to_vec())],
            blocks: vec![1; powers.len()],
            basis,
        })
    }

    pub fn is_constant(&self) -> bool {
        self.terms.iter().all(|(_, p)| p.iter().all(|&e| e == 0))
    }

    /// `4*batch*context^2 + 2048`, in the free variables' names.
    pub fn display(&self, names: &[String]) -> String {
        let mut text = String::new();
        let mut order: Vec<&(Coefficient, Vec<u32>)> = self.terms.iter().collect();
        order.sort_by_key(|(_, p)| std::cmp::Reverse(p.iter().sum::<u32>()));
        for (i, (c, powers)) in order.into_iter().enumerate() {
            let (negative, magnitude) = match c {
                Coefficient::Integer(c) => (*c < 0, c.unsigned_abs().to_string()),
                Coefficient::Fraction(c) => (*c < 0.0, format!("{:.4}", c.abs()).trim_end_matches('0').trim_end_matches('.').to_string()),
            };
            let name = |(n, &b): (&String, &i128)| if b > 1 { format!("ceil({n}/{b})") } else { n.clone() };
            let factors: Vec<String> = names
                .iter()
                .zip(&self.blocks)
                .map(name)
                .zip(powers)
                .filter(|(_, e)| **e > 0)
                .map(|(n, &e)| if e == 1 { n } else { format!("{n}^{e}") })
                .collect();
            let body = match (magnitude.as_str(), factors.is_empty()) {
                (m, true) => m.to_string(),
                ("1", false) => factors.join("*"),
                (m, false) => format!("{m}*{}", factors.join("*")),
            };
            text.push_str(match (i, negative) {
                (0, false) => "",
                (0, true) => "-",
                (_, false) => " + ",
                (_, true) => " - ",
            });
            text.push_str(&body);
        }
        text
    }
}

/// Each value counted in its block: `ceil(x / block)`.
fn in_blocks(x: &[i128], blocks: &[i128]) -> Vec<i128> {
    x.iter().zip(blocks).map(|(&v, &b)| if b > 1 { (v + b - 1).div_euclid(b) } else { v }).collect()
}

fn monomial(x: &[i128], powers: &[u32]) -> i128 {
    x.iter().zip(powers).fold(1i128, |m, (&v, &e)| m.saturating_mul(v.saturating_pow(e)))
}

/// Fits laws over `variables` free variables, remembering each set of sizes it has seen
/// (a trace repeats the same shapes many times).
pub struct Fitter {
    variables: usize,
    /// Candidate term sets, simplest first.
    candidates: Vec<Vec<Vec<u32>>>,
    memo: FxHashMap<Vec<u64>, Law>,
}

impl Fitter {
    pub fn new(variables: usize) -> Fitter {
        let mut monomials = Vec::new();
        exponents(variables, &mut Vec::new(), &mut monomials);
        monomials.sort_by_key(|m| (m.iter().sum::<u32>(), std::cmp::Reverse(m.clone())));
        let mut candidates: Vec<Vec<Vec<u32>>> = Vec::new();
        for k in 1..=MAX_TERMS.min(monomials.len()) {
            let mut sets = Vec::new();
            combinations(monomials.len(), k, &mut Vec::new(), 0, &mut sets);
            let mut sets: Vec<Vec<Vec<u32>>> = sets.into_iter().map(|s| s.into_iter().map(|i| monomials[i].clone()).collect()).collect();
            let degree = |s: &Vec<Vec<u32>>| {
                let d: Vec<u32> = s.iter().map(|m| m.iter().sum()).collect();
                (d.iter().copied().max().unwrap_or(0), d.iter().sum::<u32>())
            };
            sets.sort_by_key(degree);
            candidates.extend(sets);
        }
        Fitter { variables, candidates, memo: FxHashMap::default() }
    }

    /// The simplest law through `(x, size)` for every recording (`xs[i]` holds recording i's
    /// values of the free variables; `sizes[i]` its size).
    pub fn fit(&mut self, xs: &[Vec<i128>], sizes: &[u64]) -> Law {
        if let Some(law) = self.memo.get(sizes) {
            return law.clone();
        }
        let law = self.search(xs, sizes);
        self.memo.insert(sizes.to_vec(), law.clone());
        law
    }

    fn search(&self, xs: &[Vec<i128>], sizes: &[u64]) -> Law {
        if sizes.windows(2).all(|w| w[0] == w[1]) {
            return Law::constant(sizes[0], Basis::Fitted, self.variables);
        }
        // Distinct points; the same point with two sizes fits no law.
        let mut points: Vec<(&[i128], u64)> = Vec::new();
        for (x, &s) in xs.iter().zip(sizes) {
            match points.iter().find(|(p, _)| *p == x.as_slice()) {
                Some((_, t)) if *t != s => return Law::constant(sizes[sizes.len() - 1], Basis::Unfitted, self.variables),
                Some(_) => {}
                None => points.push((x, s)),
            }
        }
        let integer_law = |points: &[(&[i128], u64)], most_terms: usize| {
            self.candidates.iter().filter(|t| t.len() <= most_terms).find_map(|terms| solve(points, terms, true))
        };
        if let Some(law) = integer_law(&points, points.len()) {
            return law;
        }
        // A ceil division (a kernel's tiles): one variable counted in blocks, where an integer
        // law with fewer terms than points (one a recording checks) then fits. Two points are
        // too few to tell a block (at most one term would be checked, by one point).
        for v in (0..self.variables).filter(|_| points.len() >= 3) {
            for &b in &BLOCKS {
                let mut blocks = vec![1; self.variables];
                blocks[v] = b;
                let counted: Vec<Vec<i128>> = points.iter().map(|(x, _)| in_blocks(x, &blocks)).collect();
                let mut distinct = counted.clone();
                distinct.sort();
                distinct.dedup();
                if distinct.len() < points.len() {
                    continue;
                }
                let blocked: Vec<(&[i128], u64)> = counted.iter().zip(&points).map(|(x, (_, s))| (x.as_slice(), *s)).collect();
                if let Some(law) = integer_law(&blocked, points.len() - 1) {
                    return Law { blocks, ..law };
                }
            }
        }
        for terms in self.candidates.iter().filter(|t| t.len() <= points.len()) {
            if let Some(law) = solve(&points, terms, false) {
                return law;
            }
        }
        Law::constant(sizes[sizes.len() - 1], Basis::Unfitted, self.variables)
    }
}

/// Every exponent vector with each exponent and the total at most [`MAX_DEGREE`].
fn exponents(variables: usize, prefix: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
    if prefix.len() == variables {
        out.push(prefix.clone());
        return;
    }
    let used: u32 = prefix.iter().sum();
    for e in 0..=MAX_DEGREE - used {
        prefix.push(e);
        exponents(variables, prefix, out);
        prefix.pop();
    }
}

fn combinations(n: usize, k: usize, prefix: &mut Vec<usize>, from: usize, out: &mut Vec<Vec<usize>>) {
    if prefix.len() == k {
        out.push(prefix.clone());
        return;
    }
    for i in from..n {
        prefix.push(i);
        combinations(n, k, prefix, i + 1, out);
        prefix.pop();
    }
}

/// The law with these terms through every point, if one exists: solved on the first square
/// subsystem that is not singular, then checked on all points (exactly, for integers).
fn solve(points: &[(&[i128], u64)], terms: &[Vec<u32>], integer: bool) -> Option<Law> {
    let k = terms.len();
    let mut chosen = Vec::new();
    combinations(points.len(), k, &mut Vec::new(), 0, &mut chosen);
    let coefficients = chosen.iter().find_map(|rows| {
        let a: Vec<Vec<f64>> = rows.iter().map(|&r| terms.iter().map(|t| monomial(points[r].0, t) as f64).collect()).collect();
        let b: Vec<f64> = rows.iter().map(|&r| points[r].1 as f64).collect();
        gauss(a, b)
    })?;
    let law = if integer {
        let c: Vec<i128> = coefficients.iter().map(|c| c.round() as i128).collect();
        if c.contains(&0) {
            return None;
        }
        let exact = points.iter().all(|(x, s)| terms.iter().zip(&c).map(|(t, c)| c.saturating_mul(monomial(x, t))).sum::<i128>() == *s as i128);
        if !exact {
            return None;
        }
        Law { terms: c.into_iter().map(Coefficient::Integer).zip(terms.iter().cloned()).collect(), blocks: vec![1; terms[0].len()], basis: Basis::Fitted }
    } else {
        let close = points.iter().all(|(x, s)| (terms.iter().zip(&coefficients).map(|(t, c)| c * monomial(x, t) as f64).sum::<f64>() - *s as f64).abs() <= 0.5);
        if !close || coefficients.contains(&0.0) {
            return None;
        }
        Law {
            terms: coefficients.into_iter().map(Coefficient::Fraction).zip(terms.iter().cloned()).collect(),
            blocks: vec![1; terms[0].len()],
            basis: Basis::Fitted,
        }
    };
    Some(law)
}

/// Solves the square system `a x = b` by Gaussian elimination with partial pivoting; None when
/// it is singular.
fn gauss(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        let scale = a.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if a[pivot][col].abs() <= scale * 1e-12 || a[pivot][col] == 0.0 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..n {
            let f = a[row][col] / a[col][col];
            let (above, below) = a.split_at_mut(row);
            for (x, p) in below[0][col..].iter_mut().zip(&above[col][col..]) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let rest: f64 = (row + 1..n).map(|c| a[row][c] * x[c]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    Some(x)
}

/// With one recording: the variables whose values divide `size` (largest value first, each
/// once), as a law `size / (v1*v2...) * var1*var2...`. A guess from factors, so weak.
pub fn from_factors(size: u64, values: &[i128], scales: bool) -> Law {
    let mut rest = size as i128;
    let mut powers = vec![0; values.len()];
    if scales {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(values[i]));
        for i in order {
            if values[i] > 1 && rest % values[i] == 0 {
                rest /= values[i];
                powers[i] = 1;
            }
        }
    }
    Law { terms: vec![(Coefficient::Integer(rest), powers)], blocks: vec![1; values.len()], basis: Basis::Factors }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn finds_the_simplest_integer_law() {
        let mut f = Fitter::new(1);
        let xs = vec![vec![128], vec![256]];
        let n = names(&["context"]);
        assert_eq!(f.fit(&xs, &[4096, 4096]).display(&n), "4096");
        assert_eq!(f.fit(&xs, &[4 * 128 * 1024, 4 * 256 * 1024]).display(&n), "4096*context");
        assert_eq!(f.fit(&xs, &[64 * 128 * 128, 64 * 256 * 256]).display(&n), "64*context^2");
        // Shifted logits: batch x (context - 1) x vocabulary.
        let law = f.fit(&xs, &[40_000 * 127, 40_000 * 255]);
        assert_eq!(law.display(&n), "40000*context - 40000");
        assert_eq!(law.eval(&[1024]), 40_000 * 1023);
    }

    #[test]
    fn two_variables_and_products() {
        let mut f = Fitter::new(2);
        let n = names(&["batch", "context"]);
        let xs = vec![vec![1, 32], vec![1, 64], vec![2, 32]];
        let size = |b: i128, c: i128| (48 * b * c * c) as u64;
        let law = f.fit(&xs, &[size(1, 32), size(1, 64), size(2, 32)]);
        assert_eq!(law.display(&n), "48*batch*context^2");
        assert_eq!(law.eval(&[8, 1024]), size(8, 1024));
    }

    #[test]
    fn fractions_only_where_no_integer_law_fits() {
        let mut f = Fitter::new(1);
        let law = f.fit(&[vec![2], vec![4]], &[3, 5]);
        assert_eq!(law.display(&names(&["x"])), "x + 1");
        let law = f.fit(&[vec![3], vec![5]], &[1, 2]);
        assert!(matches!(law.terms[0].0, Coefficient::Fraction(_)), "{law:?}");
        assert_eq!(law.eval(&[7]), 3);
    }

    #[test]
    fn a_law_is_checked_only_by_a_point_it_was_not_solved_from() {
        let mut f = Fitter::new(1);
        let two = [vec![256], vec![512]];
        // A constant and a one-term law through two contexts: the second point checks the first.
        assert_eq!(f.fit(&two, &[4096, 4096]).sureness(2), Sureness::Checked);
        assert_eq!(f.fit(&two, &[256 * 4096, 512 * 4096]).sureness(2), Sureness::Checked);
        // Two terms through two points: any two sizes have one; a third point would check it.
        let affine = f.fit(&two, &[256 * 4096 + 512, 512 * 4096 + 512]);
        assert_eq!((affine.terms.len(), affine.sureness(2)), (2, Sureness::Extrapolated));
        let three = [vec![256], vec![512], vec![1024]];
        assert_eq!(f.fit(&three, &[256 * 4096 + 512, 512 * 4096 + 512, 1024 * 4096 + 512]).sureness(3), Sureness::Checked);
        assert_eq!(f.fit(&[vec![3], vec![5]], &[1, 2]).sureness(2), Sureness::Extrapolated, "fractional coefficients");
        assert_eq!(from_factors(4096, &[256], true).sureness(1), Sureness::Extrapolated);
        assert_eq!(Law::constant(4096, Basis::Unaligned, 1).sureness(2), Sureness::RecordedSize);
        assert_eq!(Law::constant(4096, Basis::Unfitted, 1).sureness(2), Sureness::RecordedSize);
    }

    #[test]
    fn a_kernel_that_tiles_a_dimension_is_a_ceil_division() {
        let n = names(&["batch", "context"]);
        let mut f = Fitter::new(2);
        // 4096 bytes per block of 128 tokens begun, times the batch: recorded at contexts that
        // are not multiples of 128, where no polynomial law with integer coefficients fits.
        let xs = vec![vec![2, 100], vec![2, 256], vec![2, 300], vec![4, 300]];
        let size = |b: i128, c: i128| (4096 * b * ((c + 127) / 128)) as u64;
        let law = f.fit(&xs, &xs.iter().map(|x| size(x[0], x[1])).collect::<Vec<_>>());
        assert_eq!(law.display(&n), "4096*batch*ceil(context/128)");
        assert_eq!(law.sureness(4), Sureness::Checked);
        for (b, c) in [(8, 1000), (1, 1), (3, 1025)] {
            assert_eq!(law.eval(&[b, c]), size(b, c), "at batch {b}, context {c}");
        }
        // At multiples of the block a plain law fits, and stands (it is the simpler one).
        let plain = f.fit(&[vec![2, 128], vec![2, 256]], &[size(2, 128), size(2, 256)]);
        assert_eq!(plain.display(&n), "64*context");
    }

    #[test]
    fn a_falling_law_goes_negative_and_its_size_is_clamped() {
        let mut f = Fitter::new(1);
        // Swapped values: 2 MiB "at 256", 1 MiB "at 512".
        let law = f.fit(&[vec![256], vec![512]], &[2 << 20, 1 << 20]);
        assert_eq!(law.display(&names(&["context"])), "-4096*context + 3145728");
        assert_eq!((law.value(&[384]), law.eval(&[384])), (1_572_864, 1_572_864));
        assert_eq!((law.value(&[1024]), law.eval(&[1024])), (-1_048_576, 1));
        // Exactly 0 is a size (the shifted logits at context 1), not a negative one.
        let shifted = f.fit(&[vec![128], vec![256]], &[40_000 * 127, 40_000 * 255]);
        assert_eq!((shifted.value(&[1]), shifted.eval(&[1])), (0, 1));
    }

    #[test]
    fn factors_of_one_recording() {
        let law = from_factors(4 * 4 * 128 * 1024, &[4, 128], true);
        assert_eq!(law.display(&names(&["batch", "context"])), "4096*batch*context");
        assert_eq!(from_factors(1000, &[4, 128], false).display(&names(&["batch", "context"])), "1000");
    }
}
