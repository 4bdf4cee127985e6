//! The seed articles' tensor examples: what each line allocates, at the sizes the articles use.

use super::{Parameter, Program, Recorder, Scenario, ScenarioInfo, Values, repeated_steps};
use crate::autograd;
use crate::tensor::{DType, Result};

pub(super) fn scenarios() -> Vec<Scenario> {
    let scenario = |name, title, explanation, parameters, variants: &[&'static str], program| Scenario {
        info: ScenarioInfo { name, title, explanation, parameters, variants: variants.to_vec() },
        check: repeated_steps,
        fix_settings: None,
        program: Program::Sync(program),
    };
    vec![
        scenario(
            "seed-basics",
            "Allocated and reserved: a 4 GB tensor, a batched matmul, del and empty_cache",
            "The first article's program at full size: randn(1000, 1000, 1000) is 4 GB of float32 (allocated 3814.7 MiB; \
             reserved rounds up to whole 2 MiB pages). matmul(x, x.T) is a batched matmul whose second operand (.T reverses \
             all three dimensions) is neither row- nor column-major per batch, so ATen copies it to a contiguous 4 GB \
             temporary for cuBLAS: the peak is three times the tensor. After del, allocated drops to zero but reserved \
             does not: the caching allocator keeps the segments for reuse until empty_cache() returns them to the driver.",
            vec![Parameter::integer("n", "1000", 1, 1600, "the tensor is n x n x n float32")],
            &[],
            seed_basics,
        ),
        scenario(
            "intermediates",
            "What a + b, a matmul and add_ allocate",
            "The second article's three examples. a + b allocates exactly one output (4 MB); there is no hidden \
             temporary. matmul(1000x2000, 2000x500) allocates its 2 MB output and nothing else: cuBLAS works in place. \
             a.add_(torch.randn(...)) on a leaf that requires grad is refused by PyTorch (\"a leaf Variable that requires \
             grad is being used in an in-place operation\"); the only memory involved is the randn operand. Under \
             no_grad the in-place add runs and allocates nothing beyond that operand, which is freed once the line ends.",
            vec![],
            &[],
            intermediates,
        ),
        scenario(
            "views-vs-copies",
            "Views share storage; clone, contiguous and some reshapes copy",
            "view, t(), narrow and a contiguous tensor's reshape are views: +0 bytes, sharing x's storage. clone() \
             always copies. reshape copies when the result cannot be expressed with strides (t().reshape(-1)), and \
             contiguous() copies a non-contiguous tensor but returns a contiguous one as it is. A view keeps its base's \
             whole storage alive: after del x the views still hold every byte, until they go too.",
            vec![Parameter::integer("n", "2048", 2, 16384, "x is n x n float32")],
            &[],
            views_vs_copies,
        ),
        scenario(
            "inplace-chain",
            "x = x + 1 versus x += 1: out-of-place chains double the peak",
            "The third article's in-place example. Each out-of-place step (x = x + 1, x = x * 2, x = relu(x)) allocates \
             a new tensor while the old one is still referenced, so the peak is twice the tensor; the old block goes \
             back to the cache when x is rebound. In place (x += 1, x *= 2, x.relu_()) nothing is allocated at all. \
             In-place ops are refused on leaves that require grad, and on tensors autograd saved for backward.",
            vec![Parameter::integer("n", "1000", 1, 32768, "x is n x n float32")],
            &["mistake", "fix"],
            inplace_chain,
        ),
        scenario(
            "broadcast-temporaries",
            "Broadcasting reads with stride 0; expanding and copying materialises",
            "x + y with x [rows, cols, depth] and y [depth] allocates only the result: y is read with stride 0, never \
             copied (the third article worries about a temporary that does not exist). The mistake is materialising the \
             broadcast yourself, y.expand_as(x).contiguous() (or repeat), which costs a full-size copy before the add.",
            vec![
                Parameter::integer("rows", "1000", 1, 1 << 20, "x's first dimension"),
                Parameter::integer("cols", "1000", 1, 1 << 20, "x's second dimension"),
                Parameter::integer("depth", "100", 1, 1 << 20, "x's last dimension, y's only one"),
            ],
            &["mistake", "fix"],
            broadcast_temporaries,
        ),
        scenario(
            "contiguous",
            "A transposed tensor in a loop: contiguous() costs one copy, not memory per step",
            "x.transpose(0, 1) is a view with swapped strides. In the loop x = x + 1, every step allocates one new \
             tensor either way: the memory is the same with or without contiguous(). contiguous() adds one copy up \
             front, and buys sequential reads in every later op (speed, not memory). Out-of-place ops on the \
             non-contiguous view cost the same bytes.",
            vec![Parameter::integer("n", "2048", 1, 16384, "x is n x n float32"), Parameter::integer("steps", "5", 1, 1000, "loop iterations")],
            &["mistake", "fix"],
            contiguous,
        ),
        scenario(
            "alloc-in-loop",
            "Allocating a buffer every iteration: the cache makes it cheap, not free",
            "torch.zeros(1024, 1024) inside the loop asks the allocator for 4 MiB every iteration and gives it back at \
             the end of the iteration. The caching allocator serves every request after the first from the same cached \
             block (reserved stays flat: one segment), so it is not a leak, but each iteration pays an allocation, a \
             free and a fill. Allocating once and calling zero_() reuses one block: one allocation in total.",
            vec![Parameter::integer("n", "1024", 1, 16384, "the buffer is n x n float32"), Parameter::integer("steps", "10", 1, 10_000, "iterations")],
            &["mistake", "fix"],
            alloc_in_loop,
        ),
    ]
}

fn seed_basics(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let n = v.int("n");
    rec.step("initial");
    let large = dev.randn(&[n, n, n], DType::F32)?;
    rec.step("after creating large tensor");
    // `.T` of a 3-D tensor reverses its dimensions.
    let result = large.matmul(&large.permute(&[2, 1, 0])?)?;
    rec.step("after matrix multiplication");
    drop((large, result));
    rec.step("after del (the cache keeps the segments)");
    dev.empty_cache();
    rec.step("after empty_cache");
    Ok(())
}

fn intermediates(rec: &mut Recorder, _: &Values) -> Result<()> {
    let dev = rec.device.clone();
    {
        let (a, b) = (dev.randn(&[1000, 1000], DType::F32)?, dev.randn(&[1000, 1000], DType::F32)?);
        rec.step("a, b = randn(1000, 1000) x 2");
        let _c = a.add(&b)?;
        rec.step("c = a + b");
    }
    {
        let (a, b) = (dev.randn(&[1000, 2000], DType::F32)?, dev.randn(&[2000, 500], DType::F32)?);
        rec.step("a, b = randn(1000, 2000), randn(2000, 500)");
        let _c = a.matmul(&b)?;
        rec.step("c = matmul(a, b)");
    }
    let a = dev.randn(&[1000, 1000], DType::F32)?;
    a.requires_grad_(true)?;
    rec.step("a = randn(1000, 1000, requires_grad=True)");
    let refused = a.add_(&dev.randn(&[1000, 1000], DType::F32)?).err();
    let refusal = refused.map(|e| format!("refused: {e}")).unwrap_or_else(|| "ran".into());
    rec.step(format!("a.add_(randn(1000, 1000)) {refusal}"));
    {
        let _no_grad = autograd::no_grad();
        a.add_(&dev.randn(&[1000, 1000], DType::F32)?)?;
    }
    rec.step("with no_grad: a.add_(randn(1000, 1000))");
    Ok(())
}

fn views_vs_copies(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let n = v.int("n");
    let x = dev.randn(&[n, n], DType::F32)?;
    rec.step("x = randn(n, n)");
    let views = [x.view(&[-1])?, x.t()?, x.narrow(0, 0, n / 2)?, x.reshape(&[n as isize / 2, -1])?];
    rec.step("view(-1), t(), narrow(0, 0, n/2), reshape(n/2, -1): views");
    let clone = x.clone()?;
    rec.step("clone(): a copy");
    let flat = x.t()?.reshape(&[-1])?;
    rec.step("t().reshape(-1): no strides express it, so a copy");
    let dense = x.t()?.contiguous()?;
    rec.step("t().contiguous(): a copy");
    let same = x.contiguous()?;
    rec.step("contiguous() of a contiguous tensor: itself");
    drop((clone, flat, dense, same));
    rec.step("del the copies");
    drop(x);
    rec.step("del x: the views still hold its storage");
    drop(views);
    rec.step("del the views: x's storage is freed");
    Ok(())
}

fn inplace_chain(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let n = v.int("n");
    let mut x = dev.randn(&[n, n], DType::F32)?;
    rec.step("x = randn(n, n)");
    if v.fix() {
        x.add_scalar_(1.0)?;
        rec.step("x += 1");
        x.mul_scalar_(2.0)?;
        rec.step("x *= 2");
        x.relu_()?;
        rec.step("x.relu_()");
    } else {
        x = x.add_scalar(1.0)?;
        rec.step("x = x + 1");
        x = x.mul_scalar(2.0)?;
        rec.step("x = x * 2");
        x = x.relu()?;
        rec.step("x = torch.relu(x)");
    }
    drop(x);
    Ok(())
}

fn broadcast_temporaries(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let shape = [v.int("rows"), v.int("cols"), v.int("depth")];
    let x = dev.randn(&shape, DType::F32)?;
    let y = dev.randn(&shape[2..], DType::F32)?;
    rec.step("x = randn(rows, cols, depth), y = randn(depth)");
    let result = if v.fix() {
        x.add(&y)?
    } else {
        let expanded = y.expand(&shape)?.contiguous()?;
        rec.step("y.expand_as(x).contiguous(): a full-size copy");
        x.add(&expanded)?
    };
    rec.step("result = x + y");
    drop(result);
    Ok(())
}

fn contiguous(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let n = v.int("n");
    let mut x = dev.randn(&[n, n], DType::F32)?.transpose(0, 1)?;
    rec.step("x = randn(n, n).transpose(0, 1): a view");
    if v.fix() {
        x = x.contiguous()?;
        rec.step("x = x.contiguous(): one copy, then the original is freed");
    }
    for step in 1..=v.int("steps") {
        x = x.add_scalar(1.0)?;
        rec.step(format!("x = x + 1 (step {step})"));
    }
    Ok(())
}

fn alloc_in_loop(rec: &mut Recorder, v: &Values) -> Result<()> {
    let dev = rec.device.clone();
    let n = v.int("n");
    let batch = dev.randn(&[n, n], DType::F32)?;
    let reused = if v.fix() { Some(dev.zeros(&[n, n], DType::F32)?) } else { None };
    rec.step(if v.fix() { "batch, and temp = zeros(n, n) allocated once" } else { "batch" });
    for step in 1..=v.int("steps") {
        let temp = match &reused {
            Some(temp) => {
                temp.zero_()?;
                temp.share()
            }
            None => dev.zeros(&[n, n], DType::F32)?,
        };
        temp.add_(&batch)?;
        drop(temp);
        rec.step(format!("iteration {step}"));
    }
    Ok(())
}
