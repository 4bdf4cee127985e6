//! Shape, strides (in elements) and offset: how a tensor reads its storage. Views change only
//! the layout; they never touch memory.

use super::TensorError;

/// Most dimensions a kernel handles (PyTorch allows more; no op here needs them).
pub const MAX_DIMS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Layout {
        let mut strides = vec![0; shape.len()];
        let mut acc = 1;
        for d in (0..shape.len()).rev() {
            strides[d] = acc;
            acc *= shape[d].max(1);
        }
        Layout { shape: shape.to_vec(), strides, offset: 0 }
    }

    /// Dense, with the dimensions in memory in `order` (slowest first; a permutation of the
    /// dimensions): what TensorIterator gives an elementwise result of permuted inputs.
    pub fn dense_in_order(shape: &[usize], order: &[usize]) -> Layout {
        let mut strides = vec![0; shape.len()];
        let mut acc = 1;
        for &d in order.iter().rev() {
            strides[d] = acc;
            acc *= shape[d].max(1);
        }
        Layout { shape: shape.to_vec(), strides, offset: 0 }
    }

    /// The order of the dimensions in memory that TensorIterator gives the result of an
    /// elementwise op over operands of these layouts broadcast to `shape` (`reorder_dimensions`:
    /// by the first operand whose strides tell two dimensions apart, broadcast ones ignored; equal
    /// strides put the smaller dimension inside). None: row-major, the contiguous result.
    pub fn result_order(shape: &[usize], operands: &[&Layout]) -> Option<Vec<usize>> {
        let n = shape.len();
        if n < 2 || operands.iter().all(|l| l.shape == shape && l.is_contiguous()) {
            return None;
        }
        // Each operand's strides over the result's dimensions (0 where it is broadcast).
        let strides: Vec<Vec<usize>> = operands
            .iter()
            .map(|l| {
                let lead = n - l.shape.len().min(n);
                (0..n).map(|d| if d < lead || l.shape[d - lead] != shape[d] { 0 } else { l.strides[d - lead] }).collect()
            })
            .collect();
        let should_swap = |d0: usize, d1: usize| -> std::cmp::Ordering {
            use std::cmp::Ordering::*;
            for s in &strides {
                let (s0, s1) = (s[d0], s[d1]);
                if s0 == 0 || s1 == 0 {
                    continue;
                }
                match s0.cmp(&s1) {
                    Less => return Less,
                    Greater => return Greater,
                    Equal if shape[d0] > shape[d1] => return Greater,
                    Equal => {}
                }
            }
            Equal
        };
        // Fastest first, starting from row-major; an insertion sort as ATen's.
        let mut perm: Vec<usize> = (0..n).rev().collect();
        for i in 1..n {
            let mut d1 = i;
            for d0 in (0..i).rev() {
                match should_swap(perm[d0], perm[d1]) {
                    std::cmp::Ordering::Greater => {
                        perm.swap(d0, d1);
                        d1 = d0;
                    }
                    std::cmp::Ordering::Less => break,
                    std::cmp::Ordering::Equal => {}
                }
            }
        }
        perm.reverse();
        (perm.iter().enumerate().any(|(i, &d)| i != d)).then_some(perm)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Contiguous in row-major order (size-1 dimensions may have any stride), like PyTorch.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for d in (0..self.ndim()).rev() {
            if self.shape[d] != 1 && self.strides[d] != expected {
                return false;
            }
            expected *= self.shape[d];
        }
        true
    }

    /// Every element at its own offset and no gaps between them, in whatever order of the
    /// dimensions (`is_non_overlapping_and_dense`): contiguous, or a permutation of it.
    pub fn is_dense(&self) -> bool {
        let mut dims: Vec<usize> = (0..self.ndim()).filter(|&d| self.shape[d] != 1).collect();
        dims.sort_by_key(|&d| self.strides[d]);
        let mut expected = 1;
        for d in dims {
            if self.strides[d] != expected {
                return false;
            }
            expected *= self.shape[d];
        }
        true
    }

    /// Elements of storage the layout can touch: one past the furthest element.
    pub fn storage_span(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(&n, &s)| (n - 1) * s).sum::<usize>() + 1
    }

    pub fn dim(&self, dim: isize) -> Result<usize, TensorError> {
        wrap_dim(dim, self.ndim())
    }

    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Layout, TensorError> {
        let (a, b) = (self.dim(d0)?, self.dim(d1)?);
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    pub fn permute(&self, dims: &[isize]) -> Result<Layout, TensorError> {
        if dims.len() != self.ndim() {
            return Err(TensorError::Shape(format!("permute needs {} dims, got {}", self.ndim(), dims.len())));
        }
        let dims: Vec<usize> = dims.iter().map(|&d| self.dim(d)).collect::<Result<_, _>>()?;
        let mut seen = vec![false; dims.len()];
        for &d in &dims {
            if std::mem::replace(&mut seen[d], true) {
                return Err(TensorError::Shape(format!("permute: dim {d} repeats")));
            }
        }
        Ok(Layout { shape: dims.iter().map(|&d| self.shape[d]).collect(), strides: dims.iter().map(|&d| self.strides[d]).collect(), offset: self.offset })
    }

    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Layout, TensorError> {
        let d = self.dim(dim)?;
        if start + len > self.shape[d] {
            return Err(TensorError::Shape(format!("narrow: start {start} + length {len} exceeds dimension {d} of size {}", self.shape[d])));
        }
        let mut l = self.clone();
        l.offset += start * self.strides[d];
        l.shape[d] = len;
        Ok(l)
    }

    pub fn select(&self, dim: isize, index: usize) -> Result<Layout, TensorError> {
        let d = self.dim(dim)?;
        let mut l = self.narrow(dim, index, 1)?;
        l.shape.remove(d);
        l.strides.remove(d);
        Ok(l)
    }

    pub fn unsqueeze(&self, dim: isize) -> Result<Layout, TensorError> {
        let d = wrap_dim(dim, self.ndim() + 1)?;
        let mut l = self.clone();
        let stride = if d < self.ndim() { self.strides[d] * self.shape[d] } else { 1 };
        l.shape.insert(d, 1);
        l.strides.insert(d, stride);
        Ok(l)
    }

    pub fn squeeze(&self, dim: Option<isize>) -> Result<Layout, TensorError> {
        let mut l = self.clone();
        match dim {
            Some(dim) => {
                let d = self.dim(dim)?;
                if self.shape[d] == 1 {
                    l.shape.remove(d);
                    l.strides.remove(d);
                }
            }
            None => {
                let keep: Vec<usize> = (0..self.ndim()).filter(|&d| self.shape[d] != 1).collect();
                l.shape = keep.iter().map(|&d| self.shape[d]).collect();
                l.strides = keep.iter().map(|&d| self.strides[d]).collect();
            }
        }
        Ok(l)
    }

    /// Broadcasts to `shape` with stride 0 on new or size-1 dimensions (no copy).
    pub fn expand(&self, shape: &[usize]) -> Result<Layout, TensorError> {
        if shape.len() < self.ndim() {
            return Err(TensorError::Shape(format!("expand: {:?} has fewer dims than {:?}", shape, self.shape)));
        }
        let lead = shape.len() - self.ndim();
        let mut strides = vec![0; shape.len()];
        for (i, &n) in shape.iter().enumerate() {
            if i < lead {
                continue;
            }
            let (have, stride) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = if have == n {
                stride
            } else if have == 1 {
                0
            } else {
                return Err(TensorError::Shape(format!("expand: cannot expand {:?} to {:?}", self.shape, shape)));
            };
        }
        Ok(Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }

    /// A view with another shape, when the memory allows it without a copy (PyTorch's `view`).
    pub fn view(&self, shape: &[usize]) -> Result<Layout, TensorError> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(TensorError::Shape(format!("view: shape {:?} is invalid for {} elements", shape, self.numel())));
        }
        if self.is_contiguous() {
            let mut l = Layout::contiguous(shape);
            l.offset = self.offset;
            return Ok(l);
        }
        // Split or merge dimensions that are contiguous among themselves (PyTorch's computeStride).
        let mut strides = vec![0; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        let mut chunk_base_stride = *self.strides.last().unwrap_or(&1);
        let mut tensor_numel = 1;
        let mut view_numel = 1;
        for d in (0..self.ndim()).rev() {
            tensor_numel *= self.shape[d];
            if d == 0 || (self.shape[d - 1] != 1 && self.strides[d - 1] != tensor_numel * chunk_base_stride) {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return Err(TensorError::Shape(format!(
                        "view size is not compatible with input tensor's size and stride (at least one dimension spans across two contiguous subspaces); use reshape(), which copies: {:?} -> {:?}",
                        self.shape, shape
                    )));
                }
                if d > 0 {
                    chunk_base_stride = self.strides[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        Ok(Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }
}

pub fn wrap_dim(dim: isize, ndim: usize) -> Result<usize, TensorError> {
    let n = ndim as isize;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n.max(1) {
        return Err(TensorError::Shape(format!("dimension {dim} is out of range for a tensor of {ndim} dims")));
    }
    Ok(d as usize)
}

/// NumPy/PyTorch broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, TensorError> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (x, y) {
            _ if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(TensorError::Shape(format!("shapes {a:?} and {b:?} cannot broadcast: dimension {i} is {x} vs {y}")));
            }
        };
    }
    Ok(out)
}

/// Resolves one -1 in a requested shape.
pub fn infer_shape(shape: &[isize], numel: usize) -> Result<Vec<usize>, TensorError> {
    let unknown: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
    if unknown.len() > 1 || shape.iter().any(|&s| s < -1) {
        return Err(TensorError::Shape(format!("invalid shape {shape:?}")));
    }
    let known: usize = shape.iter().filter(|&&s| s >= 0).map(|&s| s as usize).product();
    let mut out: Vec<usize> = shape.iter().map(|&s| s.max(0) as usize).collect();
    if let Some(&i) = unknown.first() {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(TensorError::Shape(format!("shape {shape:?} is invalid for {numel} elements")));
        }
        out[i] = numel / known;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_change_strides_only() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides, vec![12, 4, 1]);
        let t = l.transpose(0, 2).unwrap();
        assert_eq!((t.shape.clone(), t.strides.clone()), (vec![4, 3, 2], vec![1, 4, 12]));
        assert!(!t.is_contiguous());
        let n = l.narrow(1, 1, 2).unwrap();
        assert_eq!((n.offset, n.shape.clone()), (4, vec![2, 2, 4]));
        let e = Layout::contiguous(&[3, 1]).expand(&[2, 3, 5]).unwrap();
        assert_eq!(e.strides, vec![0, 1, 0]);
        assert!(Layout::contiguous(&[3, 2]).expand(&[3, 3]).is_err());
        assert_eq!(l.view(&[6, 4]).unwrap().strides, vec![4, 1]);
        // A transposed matrix cannot be flattened without a copy.
        assert!(Layout::contiguous(&[3, 4]).transpose(0, 1).unwrap().view(&[12]).is_err());
        // But splitting a dimension of a permuted tensor can.
        let p = Layout::contiguous(&[4, 6]).transpose(0, 1).unwrap();
        assert_eq!(p.view(&[2, 3, 4]).unwrap().strides, vec![3, 1, 6]);
        assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert!(broadcast_shapes(&[3, 2], &[4]).is_err());
        assert_eq!(infer_shape(&[-1, 4], 12).unwrap(), vec![3, 4]);
    }

    /// RoPE on a transposed q, as PyTorch lays the results out: `x * cos` keeps x's layout
    /// (cos broadcasts), `rotated * sin` is contiguous (cat makes a contiguous tensor), and their
    /// sum follows its first operand, so the next matmul must copy it.
    #[test]
    fn an_elementwise_result_takes_its_first_decisive_operands_layout() {
        let (b, t, h, d) = (2, 5, 3, 4);
        let q = Layout::contiguous(&[b, t, h, d]).transpose(1, 2).unwrap();
        let cos = Layout::contiguous(&[t, d]);
        let shape = [b, h, t, d];
        let order = Layout::result_order(&shape, &[&q, &cos]).expect("not row-major");
        assert_eq!(order, vec![0, 2, 1, 3], "batch, position, head, feature in memory: q's own order");
        let x_cos = Layout::dense_in_order(&shape, &order);
        assert_eq!(x_cos.strides, q.strides);
        assert!(x_cos.is_dense() && !x_cos.is_contiguous());
        let rotated = Layout::contiguous(&shape);
        assert_eq!(Layout::result_order(&shape, &[&x_cos, &rotated]), Some(order.clone()));
        assert_eq!(Layout::result_order(&shape, &[&rotated, &x_cos]), None, "the first operand decides");
        // Contiguous operands, or one broadcast everywhere it could tell: row-major.
        assert_eq!(Layout::result_order(&shape, &[&rotated, &rotated]), None);
        assert_eq!(Layout::result_order(&[4, 6], &[&Layout::contiguous(&[6])]), None);
        // A transposed matrix alone (`x.t() * 2`) keeps its layout; equal strides of a size-1
        // dimension change nothing.
        let xt = Layout::contiguous(&[6, 4]).transpose(0, 1).unwrap();
        assert_eq!(Layout::result_order(&[4, 6], &[&xt]), Some(vec![1, 0]));
        assert_eq!(Layout::dense_in_order(&[4, 6], &[1, 0]).strides, xt.strides);
        // Not dense: a narrowed or expanded layout.
        assert!(!Layout::contiguous(&[4, 6]).narrow(1, 0, 3).unwrap().is_dense());
        assert!(!Layout::contiguous(&[3, 1]).expand(&[3, 5]).unwrap().is_dense());
        assert!(Layout::contiguous(&[3, 1, 5]).is_dense());
    }
}
