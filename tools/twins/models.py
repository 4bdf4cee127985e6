"""The models and optimizers of tensormem's scenarios, written op for op as src/nn/ writes them,
so that PyTorch's allocator sees the same requests in the same order: the same parameters made
in the same order (one allocation each, initialised in place), the same ops in forward, the
same tensors kept alive for the same spans (a Rust binding lives to the end of its block: the
twins `del` where the Rust program drops).

Where the Rust program keeps a tensor alive that natural PyTorch code would let go (a shadowed
Rust binding), the twin keeps it too, marked `# tensormem keeps`; those lines are where the
scenario may differ from the PyTorch program it stands for.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as _checkpoint


# Set by `--natural-lifetimes`: free what natural PyTorch code frees where tensormem keeps it
# (the `# tensormem keeps` lines), to measure what the difference costs.
NATURAL_LIFETIMES = False


def checkpoint(function, *inputs):
    """`autograd::checkpoint`: torch.utils.checkpoint's reentrant form."""
    return _checkpoint(function, *inputs, use_reentrant=True)


def linear(inputs, outputs, bias, dtype, device, init=None):
    """`Linear::new` (PyTorch's default init: uniform in +-1/sqrt(in), weight then bias) or
    `Linear::with_init` with Normal(std) weights and zero bias. One allocation per parameter."""
    layer = nn.Linear(inputs, outputs, bias=bias, device=device, dtype=dtype)
    if init is not None:
        kind, value = init
        with torch.no_grad():
            if kind == "normal":
                layer.weight.normal_(0.0, value)
                if bias:
                    layer.bias.zero_()
            else:
                layer.weight.uniform_(-value, value)
                if bias:
                    layer.bias.uniform_(-value, value)
    return layer


def embedding(count, dim, dtype, device, std):
    table = nn.Embedding(count, dim, device=device, dtype=dtype)
    with torch.no_grad():
        table.weight.normal_(0.0, std)
    return table


class RmsNorm(nn.Module):
    """`RmsNorm`: x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight."""

    def __init__(self, dim, eps, dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# ---------------------------------------------------------------------------------------------
# src/nn/model.rs: `Transformer` (GPT-2 and the Llama-style model of the pitfalls)


def rotary_angles(t, d, theta, device):
    """`rotary_angles`: position * theta^(-2i/d), [t, d/2] (the inverse frequencies copied from the host)."""
    half = d // 2
    inverse = [theta ** (-2.0 * i / d) for i in range(half)]
    frequencies = torch.tensor(inverse, dtype=torch.float32).view(1, half).to(device)
    return torch.arange(t, dtype=torch.float32, device=device).view(t, 1) * frequencies


class CausalSelfAttention(nn.Module):
    """src/nn/attention.rs: separate q/k/v/o projections with RoPE (Llama) or GPT-2's fused
    c_attn; the causal mask and rotary tables are buffers made with the module."""

    def __init__(self, dim, heads, context, fused, dtype, device, init=None, dropout=0.0):
        super().__init__()
        self.heads, self.fused, self.dropout = heads, fused, dropout
        if fused:
            self.c_attn = linear(dim, 3 * dim, True, dtype, device, init)
            self.c_proj = linear(dim, dim, True, dtype, device, init)
        else:
            self.q_proj = linear(dim, dim, False, dtype, device)
            self.k_proj = linear(dim, dim, False, dtype, device)
            self.v_proj = linear(dim, dim, False, dtype, device)
            self.o_proj = linear(dim, dim, False, dtype, device)
        with torch.no_grad():
            at = torch.arange(context, dtype=torch.int32, device=device)
            self.register_buffer("mask", at.view(1, context) > at.view(context, 1), persistent=False)
            del at
            if not fused:
                angles = rotary_angles(context, dim // heads, 10_000.0, device)
                angles2 = torch.cat([angles, angles], 1)
                # (rope_tables shadows `angles`: the first lives to the function's end)
                self.register_buffer("cos", angles2.cos().to(dtype), persistent=False)
                self.register_buffer("sin", angles2.sin().to(dtype), persistent=False)
                del angles2, angles
        self.context = context

    def forward(self, x, training):
        b, t, c = x.shape
        h, d = self.heads, c // self.heads
        if self.fused:
            qkv = self.c_attn(x)
            q, k, v = qkv.narrow(2, 0, c), qkv.narrow(2, c, c), qkv.narrow(2, 2 * c, c)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, h, d).transpose(1, 2)
        k = k.view(b, t, h, d).transpose(1, 2)
        v = v.view(b, t, h, d).transpose(1, 2)
        if not self.fused:
            cos, sin = self.cos.narrow(0, 0, t), self.sin.narrow(0, 0, t)
            # tensormem keeps the pre-rotation q and k to the end of forward (shadowed Rust
            # bindings); natural PyTorch code (q, k = rotate(q), rotate(k)) frees them here.
            q_in, k_in = q, k
            q, k = rotate(q_in, cos, sin), rotate(k_in, cos, sin)
            if NATURAL_LIFETIMES:
                del q_in, k_in
        mask = self.mask.narrow(0, 0, t).narrow(1, 0, t)
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        probs = F.dropout(F.softmax(scores.masked_fill(mask, float("-inf")), -1), self.dropout, training)
        y = probs.matmul(v).transpose(1, 2).contiguous().view(b, t, c)
        return (self.c_proj if self.fused else self.o_proj)(y)


def rotate(x, cos, sin):
    """x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)."""
    d = x.shape[-1]
    x1, x2 = x.narrow(-1, 0, d // 2), x.narrow(-1, d // 2, d // 2)
    rotated = torch.cat([-x2, x1], -1)
    return x * cos + rotated * sin


class Block(nn.Module):
    """`Block`: x + dropout(attn(norm1(x))), then x + dropout(mlp(norm2(x)))."""

    def __init__(self, config, device):
        super().__init__()
        gpt2 = config["architecture"] == "gpt2"
        dim, dtype = config["dim"], config["dtype"]
        std = ("normal", 0.02)
        norm = (lambda: nn.LayerNorm(dim, eps=1e-5, device=device, dtype=dtype)) if gpt2 else (lambda: RmsNorm(dim, 1e-5, dtype, device))
        self.gpt2 = gpt2
        self.norm1 = norm()
        self.attn = CausalSelfAttention(dim, config["heads"], config["context"], gpt2, dtype, device, std if gpt2 else None, config["dropout"])
        self.norm2 = norm()
        if gpt2:
            self.c_fc = linear(dim, config["hidden"], True, dtype, device, std)
            self.c_proj = linear(config["hidden"], dim, True, dtype, device, std)
        else:
            self.w1 = linear(dim, config["hidden"], False, dtype, device)
            self.w2 = linear(config["hidden"], dim, False, dtype, device)
            self.w3 = linear(dim, config["hidden"], False, dtype, device)
        self.dropout = config["dropout"]

    def mlp(self, x):
        if self.gpt2:
            return self.c_proj(F.gelu(self.c_fc(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def forward(self, x, training):
        x = x + F.dropout(self.attn(self.norm1(x), training), self.dropout, training)
        return x + F.dropout(self.mlp(self.norm2(x)), self.dropout, training)


class Transformer(nn.Module):
    """`Transformer`: GPT-2 (learned positions, LayerNorm, GELU, biases, fused qkv, tied
    embeddings: the head is `x.matmul(wte.weight.t())`) or the Llama-style model (RoPE, RMSNorm,
    SwiGLU, untied head)."""

    def __init__(self, config, device):
        super().__init__()
        self.config = config
        gpt2 = config["architecture"] == "gpt2"
        dim, dtype = config["dim"], config["dtype"]
        self.wte = embedding(config["vocab"], dim, dtype, device, 0.02)
        self.wpe = embedding(config["context"], dim, dtype, device, 0.02) if gpt2 else None
        self.blocks = nn.ModuleList(Block(config, device) for _ in range(config["layers"]))
        self.norm = nn.LayerNorm(dim, eps=1e-5, device=device, dtype=dtype) if gpt2 else RmsNorm(dim, 1e-5, dtype, device)
        self.head = None if gpt2 else linear(dim, config["vocab"], False, dtype, device)
        self.checkpointing = False

    def ordered_parameters(self):
        """`named_parameters()` in tensormem's order (the optimizer's)."""
        out = [self.wte.weight] + ([self.wpe.weight] if self.wpe is not None else [])
        for block in self.blocks:
            out += list(block.norm1.parameters()) + attention_parameters(block.attn) + list(block.norm2.parameters())
            out += [p for l in ((block.c_fc, block.c_proj) if block.gpt2 else (block.w1, block.w2, block.w3)) for p in l.parameters()]
        return out + list(self.norm.parameters()) + (list(self.head.parameters()) if self.head is not None else [])

    def forward(self, ids, training):
        t = ids.shape[1]
        x = self.wte(ids)
        if self.wpe is not None:
            positions = torch.arange(t, dtype=torch.int64, device=ids.device)
            x = x + self.wpe(positions)
            x = F.dropout(x, self.config["dropout"], training)
            del positions
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(lambda t, block=block: block(t, training), x)
            else:
                x = block(x, training)
        x = self.norm(x)
        if self.head is not None:
            return self.head(x)
        return x.matmul(self.wte.weight.t())

    def loss(self, ids, targets, training):
        logits = self.forward(ids, training)
        return F.cross_entropy(logits.view(-1, self.config["vocab"]), targets.view(-1))


def attention_parameters(attn):
    if attn.fused:
        return list(attn.c_attn.parameters()) + list(attn.c_proj.parameters())
    return [p for l in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj) for p in l.parameters()]


def llama_small(context, device):
    """The pitfalls' model (src/scenarios/pitfalls.rs): 4 layers of width 256, vocab 1000."""
    config = dict(architecture="llama", vocab=1000, context=context, dim=256, layers=4, heads=4, hidden=688, dropout=0.0, dtype=torch.float32)
    return Transformer(config, device)


# ---------------------------------------------------------------------------------------------
# src/nn/lm.rs: the recorded run's model (einsum linears, RoPE on halves, mask made per call,
# softmax and log_softmax written out, the loss picked with gather)

LM_SIZES = {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20), "xl": (1600, 6400, 48, 25), "2.7b": (2560, 10240, 32, 32)}


def einsum_linear(x, layer):
    """`torch.einsum("bti,oi->bto", x, weight)` (tensormem models it as one bmm of x viewed
    [1, b*t, in] by weight.t())."""
    return torch.einsum("bti,oi->bto", x, layer.weight)


def softmax_written_out(x):
    max_ = x.max(-1, keepdim=True).values
    e = (x - max_).exp()
    del max_
    return e / e.sum(-1, keepdim=True)


def rotate_halves(x, cos, sin):
    half = x.shape[3] // 2
    x1, x2 = x.narrow(-1, 0, half), x.narrow(-1, half, half)
    first = x1 * cos - x2 * sin
    second = x1 * sin + x2 * cos
    return torch.cat([first, second], -1)


class LmBlock(nn.Module):
    def __init__(self, dim, hidden, heads, dtype, device, rope):
        super().__init__()
        lin = lambda i, o: linear(i, o, False, dtype, device)
        self.wq, self.wk, self.wv, self.wo = lin(dim, dim), lin(dim, dim), lin(dim, dim), lin(dim, dim)
        self.w1, self.w2, self.w3 = lin(dim, hidden), lin(hidden, dim), lin(dim, hidden)
        self.attention_norm = RmsNorm(dim, 1e-5, dtype, device)
        self.ffn_norm = RmsNorm(dim, 1e-5, dtype, device)
        self.heads = heads
        self.rope = rope

    def ordered_parameters(self):
        return [l.weight for l in (self.wq, self.wk, self.wv, self.wo, self.w1, self.w2, self.w3)] + [self.attention_norm.weight, self.ffn_norm.weight]

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))

    def feed_forward(self, h):
        gate = einsum_linear(h, self.w1)
        gate = gate * gate.sigmoid()
        up = einsum_linear(h, self.w3)
        return einsum_linear(gate * up, self.w2)

    def attention(self, x):
        b, t, c = x.shape
        h, d = self.heads, c // self.heads
        heads = lambda p: p.view(b, t, h, d).transpose(1, 2)
        cos, sin = self.rope[0].narrow(0, 0, t), self.rope[1].narrow(0, 0, t)
        q, k, v = heads(einsum_linear(x, self.wq)), heads(einsum_linear(x, self.wk)), heads(einsum_linear(x, self.wv))
        # tensormem keeps the pre-rotation q and k to the end (shadowed Rust bindings).
        q_in, k_in = q, k
        q, k = rotate_halves(q_in, cos, sin), rotate_halves(k_in, cos, sin)
        if NATURAL_LIFETIMES:
            del q_in, k_in
        at = torch.arange(t, dtype=torch.int64, device=x.device)
        mask = at.view(t, 1) >= at.view(1, t)
        del at
        scores_in = q.matmul(k.transpose(-2, -1)) / math.sqrt(d)
        # tensormem keeps the unmasked scores to the end too (`let scores = mask.where_(&scores, ..)`
        # shadows them; its `drop(scores)` drops only the masked ones).
        scores = torch.where(mask, scores_in, torch.full((), float("-inf"), dtype=scores_in.dtype, device=x.device))
        if NATURAL_LIFETIMES:
            del scores_in
        probs = softmax_written_out(scores)
        del scores
        y = probs.matmul(v).transpose(1, 2).reshape(b, t, c)
        return einsum_linear(y, self.wo)


class Lm(nn.Module):
    def __init__(self, vocab, dim, hidden, layers, heads, context, dtype, device):
        super().__init__()
        self.vocab = vocab
        self.tok_embeddings = embedding(vocab, dim, dtype, device, 1.0)
        with torch.no_grad():
            angles = rotary_angles(context, dim // heads, 10_000.0, device)
            self.rope = (angles.cos().to(dtype), angles.sin().to(dtype))
            del angles
        self.blocks = nn.ModuleList(LmBlock(dim, hidden, heads, dtype, device, self.rope) for _ in range(layers))
        self.norm = RmsNorm(dim, 1e-5, dtype, device)
        self.output = linear(dim, vocab, False, dtype, device)
        self.checkpointing = False

    def ordered_parameters(self):
        out = [self.tok_embeddings.weight]
        for block in self.blocks:
            out += block.ordered_parameters()
        return out + [self.norm.weight, self.output.weight]

    def forward(self, ids):
        x = self.tok_embeddings(ids)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x)
            else:
                x = block(x)
        x = self.norm(x)
        return einsum_linear(x, self.output)

    def loss(self, logits, targets):
        logits = logits.view(-1, self.vocab)
        max_ = logits.max(-1, keepdim=True).values
        shifted = logits - max_
        del max_
        log_sum = shifted.exp().sum(-1, keepdim=True).log()
        log_probs = shifted - log_sum
        del log_sum, shifted
        negated = -log_probs
        del log_probs
        return negated.gather(-1, targets.view(-1, 1)).mean()


def small_lm(layers, context, device):
    """The techniques' model (src/scenarios/techniques.rs `small_lm`)."""
    return Lm(1000, 256, 688, layers, 4, context, torch.float32, device)


# ---------------------------------------------------------------------------------------------
# src/nn/mod.rs `LstmCell`: written out (two linears, the gates narrowed), not nn.LSTMCell


class LstmCell(nn.Module):
    def __init__(self, inputs, hidden, dtype, device):
        super().__init__()
        bound = 1.0 / math.sqrt(max(hidden, 1))
        self.ih = linear(inputs, 4 * hidden, True, dtype, device, ("uniform", bound))
        self.hh = linear(hidden, 4 * hidden, True, dtype, device, ("uniform", bound))

    def ordered_parameters(self):
        return [self.ih.weight, self.ih.bias, self.hh.weight, self.hh.bias]

    def forward(self, x, h, c):
        gates = self.ih(x) + self.hh(h)
        n = h.shape[1]
        i = gates.narrow(1, 0, n).sigmoid()
        f = gates.narrow(1, n, n).sigmoid()
        g = gates.narrow(1, 2 * n, n).tanh()
        o = gates.narrow(1, 3 * n, n).sigmoid()
        c = f * c + i * g
        h = o * c.tanh()
        return h, c


# ---------------------------------------------------------------------------------------------
# src/nn/optim: torch.optim's foreach and single-tensor paths are PyTorch's own; HandwrittenAdamW is the recorded
# run's optimizer, as its docstring gives it


class HandwrittenAdamW:
    """The lm presets' optimizer, exactly the Python in src/nn/optim/mod.rs's doc comment."""

    def __init__(self, params, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
        self.params = list(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.state = {}
        # What GradScaler.unscale_ reads.
        self.param_groups = [{"params": self.params}]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self):
        lr, wd, eps = self.lr, self.weight_decay, self.eps
        beta1, beta2 = self.betas
        state = self.state
        for p in self.params:
            if p.grad is None:
                continue
            p.data -= lr * wd * p.data
            m_old = state.get((p, "m"), torch.zeros_like(p))
            v_old = state.get((p, "v"), torch.zeros_like(p))
            m = beta1 * m_old + (1 - beta1) * p.grad
            v = beta2 * v_old + (1 - beta2) * p.grad.pow(2)
            p.data -= lr * m / (v.sqrt() + eps)
            state[(p, "m")], state[(p, "v")] = m, v


def pitfall_model(rec, v):
    """The pitfalls' model (src/scenarios/pitfalls.rs): the Llama-style model (4 layers of width
    256, vocabulary 1000) and one batch."""
    net = llama_small(v.int("context"), rec.device)
    return _with_batch(rec, net, v.int("batch"), v.int("context"))


def small_lm_and_batch(rec, layers, batch, context):
    """`small_lm` (src/scenarios/techniques.rs): the lm family at vocabulary 1000, width 256,
    4 heads, 688 wide feed-forward, and one batch of ids and next-token targets."""
    return _with_batch(rec, small_lm(layers, context, rec.device), batch, context)


def _with_batch(rec, net, batch, context):
    rec.count_parameters(net.ordered_parameters())
    ids, targets = _token_batch(rec.device, batch, context, 1000)
    rec.step("model and batch")
    return net, ids, targets


def optimizer(name, params, foreach=True):
    """src/scenarios/training.rs `optimizer`: foreach=False runs torch.optim's single-tensor
    loops (SGD's, without weight decay, allocates as its foreach path; HandwrittenAdamW has one
    path)."""
    params = list(params)
    if name == "handwritten-adamw":
        return HandwrittenAdamW(params, 3e-4, 0.1)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=3e-4, weight_decay=0.0, foreach=foreach)
    if name == "adamw-fused":
        # A float32 `step` tensor per parameter on the device, the step in one fused kernel.
        return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01, fused=True)
    if name == "adamw8bit":
        try:
            import bitsandbytes
        except ImportError:
            raise SystemExit("optimizer=adamw8bit is bitsandbytes' AdamW8bit: this twin needs bitsandbytes (and a CUDA GPU) installed")
        if not all(p.is_cuda for p in params):
            raise SystemExit("optimizer=adamw8bit: bitsandbytes' 8-bit optimizers run on a CUDA GPU (--device cuda)")
        return bitsandbytes.optim.AdamW8bit(params, lr=3e-4, weight_decay=0.01)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, weight_decay=0.0, foreach=foreach)


def autocast(device, enabled, dtype=torch.float16):
    """`amp::autocast(dtype)`: float16 by default, on CUDA (bfloat16 on the CPU, where the twins only check the Python)."""
    dtype = dtype if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype, enabled=enabled)


def grad_scaler(device):
    return torch.amp.GradScaler(device.type)


# ---------------------------------------------------------------------------------------------
# src/scenarios/training.rs: `warmup` steps, then `steps` recorded steps

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# `amp`: the type autocast runs the forward and loss in (float16 with a GradScaler, bfloat16
# without one); `amp=true` is read as float16 (the kind's alias).
AMP_DTYPES = {"false": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_fits(v, vocab):
    """training.rs `fits`: the size check is tensormem's indexing limit; the amp check is PyTorch's."""
    if v.int("batch") * v.int("context") * vocab > 2**32 - 1:
        raise SystemExit(f"batch {v.int('batch')} x context {v.int('context')} x vocabulary {vocab} makes logits larger than tensormem can index")
    if v.choice("amp") == "float16" and v.choice("dtype") != "float32":
        raise SystemExit(f"amp=float16 keeps float32 parameters and scales their gradients: dtype={v.choice('dtype')} "
                         "would make GradScaler refuse them (\"Attempting to unscale FP16 gradients.\"); amp=bfloat16 needs no GradScaler")


def train(rec, v, net, vocab, forward, loss_of):
    """`train`: zero_grad(set_to_none) -> forward -> loss -> backward -> optimizer step, each
    labelled by phase; `warmup` steps first (none: the first recorded step is the optimizer's
    first, where it makes its state)."""
    if v.int("world") > 1 or v.int("tp") > 1 or v.flag("master_weights"):
        # One process on one GPU: torch.distributed's strategies need torchrun and a GPU per rank.
        raise SystemExit("world > 1, tp > 1 and master_weights are simulated by tensormem only; this twin runs one process (world=1, tp=1, master_weights=false)")
    dev = rec.device
    opt = optimizer(v.choice("optimizer"), net.ordered_parameters(), v.flag("foreach"))
    amp_dtype = AMP_DTYPES[v.choice("amp")]
    # A GradScaler with float16, none with bfloat16 (PyTorch's recipes).
    scaler = grad_scaler(dev) if amp_dtype == torch.float16 else None
    ids, targets = _token_batch(dev, v.int("batch"), v.int("context"), vocab)
    rec.step("model and batch")
    warmup, steps = v.int("warmup"), v.int("steps")
    for step in range(0, warmup + steps):
        def label(phase):
            if step < warmup:
                return f"warm-up {phase}" if warmup == 1 else f"warm-up {step + 1} {phase}"
            return phase if steps == 1 else f"step {step - warmup + 1} {phase}"

        opt.zero_grad(set_to_none=True)
        micro_batches = v.int("accumulation")
        for micro in range(micro_batches):
            def phase(name):
                return label(name) if micro_batches == 1 else label(f"micro-batch {micro + 1} {name}")

            ac = autocast(dev, True, amp_dtype) if amp_dtype is not None else None
            if ac is not None:
                ac.__enter__()
            # `logits` is rebound when forward returns: the previous micro-batch's go then.
            logits = forward(ids)
            rec.step(phase("forward"))
            loss = loss_of(logits, targets)
            if micro_batches > 1:
                loss = loss / micro_batches
            rec.step(phase("loss"))
            if ac is not None:
                ac.__exit__(None, None, None)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            rec.step(phase("backward"))
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        rec.step(label("optimizer step"))
        # The script's logits and loss stay referenced to the end of the step.
        del logits, loss


def _token_batch(device, batch, context, vocab):
    import common

    return common.token_batch(torch, device, batch, context, vocab)
