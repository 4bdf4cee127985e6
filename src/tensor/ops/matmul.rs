//! matmul as ATen's `_matmul_impl` does it, down to mm / bmm on the matmul kernels.

use super::{bind, check_u32};
use crate::device::MatmulClass;
use crate::kernels::matmul::{MatmulKernel, matmul_kernel};
use crate::kernels::{Grid, MatmulMeta, MatrixLayout, loads_quads};
use crate::tensor::autocast::{self as amp, Policy};
use crate::tensor::graph::{self, Save};
use crate::tensor::layout::{Layout, broadcast_shapes};
use crate::tensor::{Result, Tensor, TensorError};

impl Tensor {
    /// `matmul` with PyTorch's rules (ATen's `_matmul_impl`): 1-D operands gain and lose a
    /// dimension, a stack of matrices times a matrix folds into one product, and batch
    /// dimensions broadcast by expanding both operands and flattening their batches, which
    /// copies an operand whose expanded batches cannot be flattened in place. The copies are
    /// real memory, so they happen here as they do there.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::LowerPrecision, &[self, other])? {
            return cast[0].matmul(&cast[1]);
        }
        self.matmul_impl(other, None)
    }

    /// Self if its last two dimensions are row- or column-major with a valid leading dimension
    /// (`is_blas_compatible_*_order` in PyTorch), else a contiguous copy.
    #[track_caller]
    fn blas_compatible(&self) -> Result<Tensor> {
        let nd = self.ndim();
        let (rows, cols) = (self.shape()[nd - 2], self.shape()[nd - 1]);
        let (s0, s1) = (self.strides()[nd - 2], self.strides()[nd - 1]);
        let row_major = (s1 == 1 || cols == 1) && s0 >= cols.max(1);
        let col_major = (s0 == 1 || rows == 1) && s1 >= rows.max(1);
        if row_major || col_major || self.numel() == 0 { Ok(self.share()) } else { self.copy_for("clone") }
    }

    /// `F.linear(self, weight, bias)` as ATen's `linear` runs it: with a bias, 2-D input (and
    /// contiguous input of more dimensions, flattened) goes through one fused `addmm`;
    /// otherwise `matmul` with the transposed weight, then the bias added. Under autocast the
    /// weight and bias are cast here, before the transpose, so their f16 copies are cached.
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let inputs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::LowerPrecision, &inputs)? {
            return cast[0].linear(&cast[1], cast.get(2));
        }
        let [outputs, features] = *weight.shape() else {
            return Err(TensorError::Shape(format!("linear needs a 2-D weight, got {:?}", weight.shape())));
        };
        if self.shape().last() != Some(&features) {
            return Err(TensorError::Shape(format!("linear: input {:?} does not end in the weight's {features} features", self.shape())));
        }
        let w_t = weight.t()?;
        match bias {
            Some(b) if self.ndim() == 2 => Tensor::addmm(b, self, &w_t),
            Some(b) if self.is_contiguous() && self.ndim() > 2 => {
                let mut shape: Vec<isize> = self.shape().iter().map(|&n| n as isize).collect();
                *shape.last_mut().expect("at least 3 dims") = outputs as isize;
                Tensor::addmm(b, &self.view(&[-1, features as isize])?, &w_t)?.view(&shape)
            }
            Some(b) => self.matmul(&w_t)?.add(b),
            None => self.matmul(&w_t),
        }
    }

    /// `bmm`: batched matmul of two 3-D tensors with equal batch sizes.
    #[track_caller]
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        if self.ndim() != 3 || other.ndim() != 3 || self.shape()[0] != other.shape()[0] {
            return Err(TensorError::Shape(format!("bmm needs [b, n, m] @ [b, m, p], got {:?} @ {:?}", self.shape(), other.shape())));
        }
        self.matmul(other)
    }

    /// The last two dimensions swapped (`mT`).
    #[track_caller]
    fn mt(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }

    /// `matmul` with the kernel named, instead of the one tuned for this adapter (benchmarks and
    /// tests compare them).
    #[track_caller]
    pub fn matmul_with(&self, other: &Tensor, kind: MatmulKernel) -> Result<Tensor> {
        self.matmul_impl(other, Some(kind))
    }

    #[track_caller]
    fn matmul_impl(&self, other: &Tensor, kind: Option<MatmulKernel>) -> Result<Tensor> {
        self.same_device(other)?;
        if self.dtype != other.dtype {
            return Err(TensorError::DType(format!("matmul of {} and {}", self.dtype, other.dtype)));
        }
        if !self.dtype.is_float() {
            return Err(TensorError::DType(format!("matmul of {} tensors is not supported (floats only)", self.dtype)));
        }
        let (d1, d2) = (self.ndim(), other.ndim());
        if d1 == 0 || d2 == 0 {
            return Err(TensorError::Shape(format!("both arguments to matmul need to be at least 1D, but they are {d1}D and {d2}D")));
        }
        let k1 = self.shape()[d1 - 1];
        let k2 = if d2 == 1 { other.shape()[0] } else { other.shape()[d2 - 2] };
        if k1 != k2 {
            return Err(TensorError::Shape(format!("matmul: {:?} @ {:?}: inner dimensions {k1} and {k2} differ", self.shape(), other.shape())));
        }
        match (d1, d2) {
            // dot, mv, vector-matrix, mm: one product of matrices.
            (1, 1) => self.unsqueeze(0)?.mm(&other.unsqueeze(1)?, kind)?.view(&[]),
            (2, 1) => self.mm(&other.unsqueeze(1)?, kind)?.squeeze(Some(-1)),
            (1, 2) => self.unsqueeze(0)?.mm(other, kind)?.squeeze(Some(0)),
            (2, 2) => self.mm(other, kind),
            _ if self.should_fold(other) => {
                // The stack of matrices becomes one tall matrix (a view: should_fold checked).
                let transpose = d2 > d1;
                let t1 = if transpose { other.mt()? } else { self.share() };
                let t2 = if !transpose {
                    other.share()
                } else if d1 == 2 {
                    self.t()?
                } else {
                    self.share()
                };
                let mut out_shape: Vec<isize> = t1.shape()[..t1.ndim() - 1].iter().map(|&n| n as isize).collect();
                let folded: usize = t1.shape()[..t1.ndim() - 1].iter().product();
                let k = *t1.shape().last().expect("at least 3 dims");
                let t1_folded = t1.reshape_for(&[folded as isize, k as isize], "matmul")?;
                if t2.ndim() == 2 {
                    out_shape.push(t2.shape()[1] as isize);
                    let out = t1_folded.mm(&t2, kind)?.view(&out_shape)?;
                    if transpose { out.mt()?.contiguous() } else { Ok(out) }
                } else {
                    t1_folded.mm(&t2.unsqueeze(1)?, kind)?.view(&out_shape)
                }
            }
            _ => {
                let n = if d1 > 1 { self.shape()[d1 - 2] } else { 1 };
                let p = if d2 > 1 { other.shape()[d2 - 1] } else { 1 };
                let batch = broadcast_shapes(&self.shape()[..d1.saturating_sub(2)], &other.shape()[..d2.saturating_sub(2)])?;
                let batches: usize = batch.iter().product();
                let with = |tail: &[usize]| batch.iter().chain(tail).copied().collect::<Vec<usize>>();
                // Operands whose batch dimensions fold into no strides are copied: matmul's
                // own copies (what bmm saves for backward), not a clone() of the program's.
                let t1 = self.expand(&with(&[n, k1]))?.reshape_for(&[batches as isize, n as isize, k1 as isize], "matmul")?;
                let t2 = if d2 == 1 {
                    other.expand(&with(&[k2]))?.reshape_for(&[batches as isize, k2 as isize], "matmul")?.unsqueeze(2)?
                } else {
                    other.expand(&with(&[k2, p]))?.reshape_for(&[batches as isize, k2 as isize, p as isize], "matmul")?
                };
                let mut out_shape: Vec<isize> = batch.iter().map(|&b| b as isize).collect();
                if d1 > 1 {
                    out_shape.push(n as isize);
                }
                if d2 > 1 {
                    out_shape.push(p as isize);
                }
                t1.mm(&t2, kind)?.view(&out_shape)
            }
        }
    }

    /// ATen's `should_fold`: whether a stack of matrices times a matrix (or vector) is done as one
    /// product, folding the stack's batches into rows, which needs no copy when the batch
    /// dimensions are contiguous with each other.
    fn should_fold(&self, other: &Tensor) -> bool {
        let larger = self.ndim() >= other.ndim();
        let Ok(t1) = (if larger { Ok(self.share()) } else { other.mt() }) else { return false };
        let small = if larger { other.ndim() } else { self.ndim() };
        if !(t1.ndim() >= 3 && small <= 2) || self.ndim() == 2 {
            return false;
        }
        if t1.numel() == 0 {
            return true;
        }
        (0..t1.ndim() - 2).all(|i| t1.strides()[i] == t1.strides()[i + 1] * t1.shape()[i + 1])
    }

    /// `mm` (2-D operands) or `bmm` (3-D, equal batches): one output allocation, after copies of
    /// operands cuBLAS could not take as they are.
    #[track_caller]
    fn mm(&self, other: &Tensor, kind: Option<MatmulKernel>) -> Result<Tensor> {
        // matmul hands over matrices, or equal batches of them (3-D).
        debug_assert!(matches!(self.ndim(), 2 | 3) && self.ndim() == other.ndim());
        let out = {
            // The copies BLAS needs are the kernel's business, not the graph's.
            let _no_grad = graph::no_grad();
            self.mm_forward(other, kind, "matmul", false)?
        };
        Ok(self.record_mm(other, None, out))
    }

    /// Records mm (bmm for 3-D; addmm with a bias): each input's gradient needs the other
    /// operand, so each is saved only when the other needs a gradient, as `derivatives.yaml` has
    /// it. As ATen's `mm_mat1_backward` / `mm_mat2_backward`, a column-major operand (a weight
    /// seen through `.t()`) gets its gradient computed transposed, so that it arrives
    /// contiguous where the weight is.
    #[track_caller]
    fn record_mm(&self, other: &Tensor, bias: Option<&Tensor>, out: Tensor) -> Tensor {
        let mut inputs = vec![self, other];
        inputs.extend(bias);
        if !graph::records(&inputs) {
            return out;
        }
        let need = [self.requires_grad(), other.requires_grad()];
        let save = [need[0].then_some(Save::Input(other)), need[1].then_some(Save::Input(self))];
        let name = match (bias.is_some(), self.ndim()) {
            (true, _) => "AddmmBackward0",
            (false, 3) => "BmmBackward0",
            _ => "MmBackward0",
        };
        let column_major = |t: &Tensor| t.ndim() == 2 && t.strides()[0] == 1 && t.strides()[1] == t.shape()[0];
        let (a_column_major, b_column_major) = (column_major(self), column_major(other));
        let bias_shape = bias.map(|b| b.shape().to_vec());
        graph::record(
            name,
            &inputs,
            out,
            &save,
            Box::new(move |saved, g| {
                let (b, a) = (saved[0].as_ref(), saved[1].as_ref());
                let grad_a = || match b {
                    Some(b) if a_column_major => b.matmul(&g.mt()?)?.mt().map(Some),
                    Some(b) => Ok(Some(g.matmul(&b.mt()?)?)),
                    None => Ok(None),
                };
                let grad_b = || match a {
                    Some(a) if b_column_major => g.mt()?.matmul(a)?.mt().map(Some),
                    Some(a) => Ok(Some(a.mt()?.matmul(g)?)),
                    None => Ok(None),
                };
                // PyTorch's generated nodes compute their inputs' gradients in the alphabetical
                // order of the arguments' names: mm's and bmm's (self, mat2) mat2 first,
                // addmm's (self, mat1, mat2) mat1 first.
                let (ga, gb) = if bias_shape.is_some() {
                    let ga = grad_a()?;
                    (ga, grad_b()?)
                } else {
                    let gb = grad_b()?;
                    (grad_a()?, gb)
                };
                let mut grads = vec![ga, gb];
                if let Some(shape) = &bias_shape {
                    grads.push(Some(g.sum_to(shape)?));
                }
                Ok(grads)
            }),
        )
    }

    /// `addmm(bias, mat1, mat2)`: `bias + mat1 @ mat2` for 2-D matrices and a bias broadcast
    /// to the result (`F.linear` with a bias): one output allocation.
    #[track_caller]
    pub fn addmm(bias: &Tensor, mat1: &Tensor, mat2: &Tensor) -> Result<Tensor> {
        if let Some((cast, _autocast_off)) = amp::cast_inputs(Policy::LowerPrecision, &[bias, mat1, mat2])? {
            return Tensor::addmm(&cast[0], &cast[1], &cast[2]);
        }
        if mat1.ndim() != 2 || mat2.ndim() != 2 || mat1.shape()[1] != mat2.shape()[0] {
            return Err(TensorError::Shape(format!("addmm needs [n, m] @ [m, p], got {:?} @ {:?}", mat1.shape(), mat2.shape())));
        }
        let out = {
            let _no_grad = graph::no_grad();
            let out = mat1.mm_forward(mat2, None, "addmm", goes_through_cublaslt(bias, mat1, mat2))?;
            out.add_(bias)?;
            out
        };
        Ok(mat1.record_mm(mat2, Some(bias), out))
    }

    #[track_caller]
    fn mm_forward(&self, other: &Tensor, kind: Option<MatmulKernel>, op: &'static str, lt: bool) -> Result<Tensor> {
        let a = self.blas_compatible()?;
        let b = other.blas_compatible()?;
        let batch: Vec<usize> = a.shape()[..a.ndim() - 2].to_vec();
        let (m, k) = (a.shape()[a.ndim() - 2], a.shape()[a.ndim() - 1]);
        let n = b.shape()[b.ndim() - 1];
        let (la, lb) = (a.layout.clone(), b.layout.clone());
        let mut out_shape = batch.clone();
        out_shape.extend([m, n]);
        let out = self.device().empty_tensor(&out_shape, self.dtype, op)?;
        let device = self.device().clone();
        if k > 0 && out.numel() > 0 {
            // cuBLAS's first call on this thread allocates its workspace after the output.
            device.blas_workspaces(lt)?;
        }
        let batches: usize = batch.iter().product();
        // A multiply and an add per term.
        let flops = [batches, m, n, k].iter().fold(2u64, |f, &d| f.saturating_mul(d as u64));
        if k == 0 {
            // A sum over nothing.
            out.fill_(0.0)?;
        } else if out.launches(&[&a, &b], flops) {
            for t in [&a, &b, &out] {
                check_u32(t)?;
            }
            let bound = bind(&[&out, &a, &b])?;
            // Four elements a load (128 bits of f32, 64 of native f16) when an operand's rows
            // are contiguous and start at multiples of 4 elements.
            let nb = batch.len();
            let quads = loads_quads(self.dtype, device.native_f16());
            let quad = |l: &Layout, base: u32, cols: usize, i: usize| {
                quads
                    && bound.plan.exclusive(i)
                    && l.strides[nb + 1] == 1
                    && cols.is_multiple_of(4)
                    && l.strides[nb].is_multiple_of(4)
                    && (base as usize + l.offset).is_multiple_of(4)
                    && l.strides[..nb].iter().all(|s| s.is_multiple_of(4))
            };
            let (a_vec4, b_vec4) = (quad(&la, bound.plan.base(1), k, 1), quad(&lb, bound.plan.base(2), n, 2));
            let kind = match kind {
                Some(kind) => kind,
                None => device.matmul_kernel_for(MatmulClass::new(self.dtype, m, n, k, a_vec4, b_vec4)),
            };
            let (kernel, groups) = matmul_kernel(kind, self.dtype, device.native_f16(), &bound.plan, [a_vec4, b_vec4], m, n, batches)?;
            // mm has no batch dimension, bmm one (its stride may be 0: a broadcast operand).
            let matrix = |l: &Layout, base: u32| MatrixLayout {
                offset: base + l.offset as u32,
                batch_stride: if nb == 1 { l.strides[0] as u32 } else { 0 },
                row_stride: l.strides[nb] as u32,
                col_stride: l.strides[nb + 1] as u32,
            };
            let meta = MatmulMeta {
                m: m as u32,
                n: n as u32,
                k: k as u32,
                batches: batches as u32,
                a: matrix(&la, bound.plan.base(1)),
                b: matrix(&lb, bound.plan.base(2)),
                c: matrix(&out.layout, bound.plan.base(0)),
            };
            device.launch(&kernel, &meta, &bound, Grid::Groups(groups))?;
        }
        Ok(out)
    }
}

/// Whether ATen's addmm takes cuBLASLt's path with the bias fused (`addmm_out_cuda_impl`'s
/// `useLtInterface`): a contiguous 1-D bias as long as the rows, floating point, and both
/// matrices more than one row and column and under 65,535 x 32 in each dimension.
fn goes_through_cublaslt(bias: &Tensor, mat1: &Tensor, mat2: &Tensor) -> bool {
    const LIMIT: usize = 65535 * 32;
    let fits = |t: &Tensor| t.shape().iter().all(|&d| d > 1 && d < LIMIT);
    bias.ndim() == 1 && bias.shape()[0] == mat2.shape()[1] && bias.is_contiguous() && bias.dtype().is_float() && fits(mat1) && fits(mat2)
}
