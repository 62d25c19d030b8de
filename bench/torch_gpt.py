#!/usr/bin/python3
"""PyTorch peer of troupe's GPT-2: speed-benchmark comparison and outside numerical oracle.

Run with Debian's interpreter (/usr/bin/python3: torch, numpy, h5py); the pyenv `python3` on PATH has no torch.

Subcommands:
  train-bench  time fp32 training steps (AdamW, grad clipping) of a GPT-2 model, print one JSON line.
  eval         load a Hugging Face GPT2LMHeadModel state dict stored in HDF5 (e.g. `troupe ckpt export --format hf`),
               compute the mean next-token loss over fixed windows of a Megatron MMIDIDX dataset, print one JSON line.

The model matches troupe's exactly: pre-LayerNorm blocks (eps 1e-5), learned position embeddings, token embedding tied
with the output head, fused c_attn producing [q | k | v], causal softmax attention scaled by 1/sqrt(head size), MLP with
tanh-approximated GELU, biases on every linear, no dropout. The loss is the cross-entropy over the real vocabulary.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

# ----------------------------------------------------------------------------------------------------------------------
# Megatron MMIDIDX indexed dataset (.idx + .bin), read-only.

_MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
_MMIDIDX_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


class MMapIndexedDataset:
    """Megatron's memory-mapped indexed dataset.

    .idx: 9-byte magic b"MMIDIDX\\x00\\x00", uint64 LE version (1), uint8 dtype code, uint64 sequence count N,
    uint64 document count D, int32 sizes[N], int64 pointers[N] (byte offsets into .bin), int64 doc_idx[D].
    .bin: the token arrays of that dtype, back to back.
    """

    def __init__(self, prefix):
        self.prefix = prefix
        idx_path, bin_path = prefix + ".idx", prefix + ".bin"
        with open(idx_path, "rb") as f:
            magic = f.read(9)
            if magic != _MMIDIDX_MAGIC:
                raise ValueError(f"{idx_path}: not an MMIDIDX index (magic {magic!r})")
            header = f.read(8 + 1 + 8 + 8)
            if len(header) != 25:
                raise ValueError(f"{idx_path}: truncated header")
            version = int.from_bytes(header[0:8], "little")
            if version != 1:
                raise ValueError(f"{idx_path}: unsupported version {version}")
            code = header[8]
            if code not in _MMIDIDX_DTYPES:
                raise ValueError(f"{idx_path}: unknown dtype code {code}")
            self.dtype = np.dtype(_MMIDIDX_DTYPES[code])
            n = int.from_bytes(header[9:17], "little")
            d = int.from_bytes(header[17:25], "little")
            offset = f.tell()
        expected = offset + 4 * n + 8 * n + 8 * d
        if os.path.getsize(idx_path) < expected:
            raise ValueError(f"{idx_path}: truncated (need {expected} bytes)")
        idx = np.memmap(idx_path, dtype=np.uint8, mode="r")
        self.sizes = np.frombuffer(idx, dtype="<i4", count=n, offset=offset)
        self.pointers = np.frombuffer(idx, dtype="<i8", count=n, offset=offset + 4 * n)
        self.doc_idx = np.frombuffer(idx, dtype="<i8", count=d, offset=offset + 12 * n)
        self._idx = idx
        bin_size = os.path.getsize(bin_path)
        self._bin = np.memmap(bin_path, dtype=np.uint8, mode="r") if bin_size > 0 else np.zeros(0, np.uint8)
        if n > 0:
            ends = self.pointers + self.sizes.astype(np.int64) * self.dtype.itemsize
            if int(ends.max()) > bin_size or int(self.pointers.min()) < 0:
                raise ValueError(f"{bin_path}: sequences run past the end of the file")

    def __len__(self):
        return len(self.sizes)

    def get(self, i):
        """Sequence i as a read-only numpy array (a view of the memory map)."""
        ptr, size = int(self.pointers[i]), int(self.sizes[i])
        return np.frombuffer(self._bin, dtype=self.dtype, count=size, offset=ptr)

    def token_stream(self):
        """All sequences concatenated in index order (a view when they lie back to back in .bin)."""
        n = len(self)
        if n == 0:
            return np.zeros(0, dtype=self.dtype)
        item = self.dtype.itemsize
        expected_ptrs = np.concatenate([[0], np.cumsum(self.sizes.astype(np.int64) * item)[:-1]])
        total = int(self.sizes.astype(np.int64).sum())
        if np.array_equal(self.pointers, expected_ptrs + self.pointers[0]):
            return np.frombuffer(self._bin, dtype=self.dtype, count=total, offset=int(self.pointers[0]))
        return np.concatenate([self.get(i) for i in range(n)])


# ----------------------------------------------------------------------------------------------------------------------
# The model. torch is imported lazily so that thread-count environment variables can be set first.

torch = nn = F = None


def _import_torch():
    global torch, nn, F
    if torch is None:
        import torch as _torch
        import torch.nn as _nn
        import torch.nn.functional as _F

        torch, nn, F = _torch, _nn, _F


def build_model_classes():
    _import_torch()

    class CausalSelfAttention(nn.Module):
        def __init__(self, n_embd, n_head, n_positions):
            super().__init__()
            assert n_embd % n_head == 0, "hidden size must be divisible by the number of heads"
            self.n_head = n_head
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            mask = torch.ones(n_positions, n_positions, dtype=torch.bool).tril()
            self.register_buffer("causal_mask", mask.view(1, 1, n_positions, n_positions), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            hs = C // self.n_head
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, H, T, hs)
            k = k.view(B, T, self.n_head, hs).transpose(1, 2)
            v = v.view(B, T, self.n_head, hs).transpose(1, 2)
            att = (q * (1.0 / math.sqrt(hs))) @ k.transpose(-2, -1)  # (B, H, T, T)
            att = att.masked_fill(~self.causal_mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # (B, H, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self, n_embd):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.c_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, n_embd, n_head, n_positions, eps):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
            self.attn = CausalSelfAttention(n_embd, n_head, n_positions)
            self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
            self.mlp = MLP(n_embd)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    class GPT(nn.Module):
        """GPT-2 with Hugging Face parameter names (nn.Linear orientation: weights are (out, in)).

        vocab_size: rows of wte (and logits computed); real_vocab: how many of them the loss uses (troupe masks the
        padding rows out of the softmax), default all.
        """

        def __init__(self, n_layer, n_embd, n_head, n_positions, vocab_size, real_vocab=None, eps=1e-5):
            super().__init__()
            self.n_layer, self.n_embd, self.n_head = n_layer, n_embd, n_head
            self.n_positions, self.vocab_size = n_positions, vocab_size
            self.real_vocab = vocab_size if real_vocab is None else real_vocab
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(vocab_size, n_embd),
                    wpe=nn.Embedding(n_positions, n_embd),
                    h=nn.ModuleList([Block(n_embd, n_head, n_positions, eps) for _ in range(n_layer)]),
                    ln_f=nn.LayerNorm(n_embd, eps=eps),
                )
            )
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied
            self.apply(self._init_weights)
            for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

        @staticmethod
        def _init_weights(module):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def untie(self):
            self.lm_head.weight = nn.Parameter(self.transformer.wte.weight.detach().clone())

        def forward(self, idx, targets=None, reduction="mean"):
            B, T = idx.shape
            if T > self.n_positions:
                raise ValueError(f"sequence length {T} exceeds n_positions {self.n_positions}")
            pos = torch.arange(T, dtype=torch.long, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            logits = self.lm_head(x)
            if targets is None:
                return logits, None
            flat = logits.view(-1, logits.size(-1))
            if self.real_vocab != self.vocab_size:
                flat = flat[:, : self.real_vocab]
            loss = F.cross_entropy(flat, targets.reshape(-1), reduction=reduction)
            return logits, loss

    return GPT


# ----------------------------------------------------------------------------------------------------------------------
# Hugging Face GPT-2 state dict from HDF5.

_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _attr_int(attrs, name):
    if name not in attrs:
        return None
    value = np.asarray(attrs[name]).reshape(-1)
    return int(value[0]) if value.size else None


def load_hf_h5(path, dtype, n_head_override=None):
    """Build a GPT from an HDF5 file of GPT2LMHeadModel state-dict keys (Conv1D weights in (in, out) orientation)."""
    import h5py

    GPT = build_model_classes()
    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
        config = {}
        if "config" in attrs:  # optional JSON config string
            try:
                raw = attrs["config"]
                config = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
            except (ValueError, TypeError):
                config = {}

        def cfg(name):
            v = _attr_int(attrs, name)
            if v is None and name in config:
                v = int(config[name])
            return v

        def get(key):
            if key not in f:
                raise KeyError(f"{path}: missing dataset {key!r}")
            return np.asarray(f[key][()])

        wte = get("transformer.wte.weight")
        wpe = get("transformer.wpe.weight")
        V, C = wte.shape
        P = wpe.shape[0]
        n_layer = cfg("n_layer")
        if n_layer is None:
            n_layer = 0
            while f"transformer.h.{n_layer}.ln_1.weight" in f:
                n_layer += 1
        n_embd = cfg("n_embd") or C
        n_positions = cfg("n_positions") or P
        vocab = cfg("vocab_size") or V
        n_head = cfg("n_head")
        if n_head_override is not None:
            if n_head is not None and n_head != n_head_override:
                raise ValueError(f"--num-attention-heads {n_head_override} contradicts the file's n_head {n_head}")
            n_head = n_head_override
        if n_head is None:
            if C % 64 != 0:
                raise ValueError(f"{path}: no n_head attribute and hidden size {C} is not a multiple of 64; "
                                 "pass --num-attention-heads")
            n_head = C // 64
        if (n_embd, n_positions, vocab) != (C, P, V):
            raise ValueError(f"{path}: attributes (n_embd={n_embd}, n_positions={n_positions}, vocab_size={vocab}) "
                             f"disagree with shapes wte {wte.shape}, wpe {wpe.shape}")

        eps = 1e-5
        if "layer_norm_epsilon" in attrs:
            eps = float(np.asarray(attrs["layer_norm_epsilon"]).reshape(-1)[0])
        elif "layer_norm_epsilon" in config:
            eps = float(config["layer_norm_epsilon"])
        model = GPT(n_layer, C, n_head, P, V, eps=eps)
        tensors = {"transformer.wte.weight": wte, "transformer.wpe.weight": wpe}
        names = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                 "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                 "mlp.c_proj.weight", "mlp.c_proj.bias"]
        for i in range(n_layer):
            for n in names:
                key = f"transformer.h.{i}.{n}"
                t = get(key)
                if n.endswith(_CONV1D_SUFFIXES):
                    t = t.T  # Conv1D (in, out) -> nn.Linear (out, in)
                tensors[key] = t
        tensors["transformer.ln_f.weight"] = get("transformer.ln_f.weight")
        tensors["transformer.ln_f.bias"] = get("transformer.ln_f.bias")
        lm_head = np.asarray(f["lm_head.weight"][()]) if "lm_head.weight" in f else None

    if lm_head is not None and not np.array_equal(lm_head, wte):
        if lm_head.shape != wte.shape:
            raise ValueError(f"{path}: lm_head.weight {lm_head.shape} vs wte {wte.shape}")
        print("torch_gpt: lm_head.weight differs from transformer.wte.weight; using it untied", file=sys.stderr)
        model.untie()
        tensors["lm_head.weight"] = lm_head

    model = model.to(dtype)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, arr in tensors.items():
            p = params[key]
            if tuple(p.shape) != tuple(arr.shape):
                raise ValueError(f"{path}: {key} has shape {arr.shape}, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(dtype))
    missing = set(params) - set(tensors)  # a tied lm_head.weight is not listed separately
    if missing:
        raise ValueError(f"{path}: parameters not loaded: {sorted(missing)}")
    return model


# ----------------------------------------------------------------------------------------------------------------------
# Subcommands.


def _set_thread_env(threads):
    # Before importing torch: OpenMP (ATen) and OpenBLAS (Debian's torch links OpenBLAS) read these at start-up.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def model_flops_per_iter(B, s, l, h, V):
    """Megatron paper's count (forward + backward, no recomputation)."""
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def cmd_train_bench(args):
    _set_thread_env(args.threads)
    GPT = build_model_classes()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    B, S = args.micro_batch_size, args.seq_length

    model = GPT(args.num_layers, args.hidden_size, args.num_attention_heads, S, args.vocab_size)
    model.train()

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, foreach=not args.no_foreach)
    except TypeError:  # older torch without foreach
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    params = [p for p in model.parameters()]

    rng = np.random.default_rng(args.seed)
    if args.data_prefix:
        stream = MMapIndexedDataset(args.data_prefix).token_stream()
        if len(stream) < S + 1:
            raise SystemExit(f"{args.data_prefix}: only {len(stream)} tokens, need at least {S + 1}")
        if int(stream.max()) >= args.vocab_size:
            raise SystemExit(f"{args.data_prefix}: token id {int(stream.max())} >= vocab size {args.vocab_size}")

        def get_batch():
            starts = rng.integers(0, len(stream) - S, size=B)
            w = torch.from_numpy(np.stack([np.asarray(stream[i: i + S + 1], dtype=np.int64) for i in starts]))
            return w[:, :-1], w[:, 1:]
    else:
        def get_batch():
            w = torch.from_numpy(rng.integers(0, args.vocab_size, size=(B, S + 1), dtype=np.int64))
            return w[:, :-1], w[:, 1:]

    total = args.warmup_iters + args.iters
    t0 = None
    loss = None
    for it in range(total):
        if it == args.warmup_iters:
            t0 = time.perf_counter()
        x, y = get_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
    final_loss = loss.item()
    elapsed = time.perf_counter() - (t0 if t0 is not None else time.perf_counter())

    iters = args.iters
    ms_per_iter = 1000.0 * elapsed / iters if iters > 0 else float("nan")
    tokens_per_sec = B * S * iters / elapsed if iters > 0 and elapsed > 0 else float("nan")
    flops = model_flops_per_iter(B, S, args.num_layers, args.hidden_size, args.vocab_size)
    out = {
        "impl": "pytorch",
        "torch_version": torch.__version__,
        "threads": args.threads,
        "tokens_per_sec": tokens_per_sec,
        "ms_per_iter": ms_per_iter,
        "iters": iters,
        "final_loss": final_loss,
        "model_flops_per_iter": flops,
        "model_tflops": flops / (ms_per_iter / 1000.0) / 1e12 if iters > 0 else float("nan"),
        "config": {
            "num_layers": args.num_layers, "hidden_size": args.hidden_size,
            "num_attention_heads": args.num_attention_heads, "seq_length": S, "micro_batch_size": B,
            "vocab_size": args.vocab_size, "warmup_iters": args.warmup_iters,
            "data": args.data_prefix or "random",
        },
    }
    print(json.dumps(out), flush=True)


def cmd_eval(args):
    if args.threads:
        _set_thread_env(args.threads)
    _import_torch()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.double else torch.float32
    model = load_hf_h5(args.hf_h5, dtype, args.num_attention_heads)
    model.eval()
    S = args.seq_length
    if S > model.n_positions:
        raise SystemExit(f"--seq-length {S} exceeds the model's n_positions {model.n_positions}")

    stream = MMapIndexedDataset(args.data_prefix).token_stream()
    windows = (len(stream) - 1) // S if len(stream) > 0 else 0
    K = windows if args.samples is None else args.samples
    if K > windows:
        raise SystemExit(f"--samples {K}: the dataset has only {windows} windows of {S}+1 tokens")
    if K <= 0:
        raise SystemExit("no windows to evaluate")
    used = np.asarray(stream[: K * S + 1]).astype(np.int64)
    if used.min() < 0 or used.max() >= model.vocab_size:
        raise SystemExit(f"token ids outside [0, {model.vocab_size}) in the evaluated windows")

    total_loss = 0.0
    count = 0
    with torch.no_grad():
        for start in range(0, K, args.batch_size):
            ks = range(start, min(K, start + args.batch_size))
            w = torch.from_numpy(np.stack([used[k * S: k * S + S + 1] for k in ks]))
            _, loss_sum = model(w[:, :-1], w[:, 1:], reduction="sum")
            total_loss += float(loss_sum.double())
            count += w.shape[0] * S
    loss = total_loss / count
    print(json.dumps({"loss": loss, "perplexity": math.exp(loss), "tokens": count}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    tb = sub.add_parser("train-bench", help="time fp32 training iterations; print one JSON line")
    tb.add_argument("--num-layers", type=int, default=4)
    tb.add_argument("--hidden-size", type=int, default=384)
    tb.add_argument("--num-attention-heads", type=int, default=6)
    tb.add_argument("--seq-length", type=int, default=256)
    tb.add_argument("--micro-batch-size", type=int, default=8)
    tb.add_argument("--vocab-size", type=int, default=50304)
    tb.add_argument("--threads", type=int, default=2)
    tb.add_argument("--warmup-iters", type=int, default=2)
    tb.add_argument("--iters", type=int, default=10)
    tb.add_argument("--data-prefix", default=None, help="MMIDIDX dataset prefix (P.bin/P.idx); random tokens if absent")
    tb.add_argument("--seed", type=int, default=1234)
    tb.add_argument("--lr", type=float, default=1e-4)
    tb.add_argument("--weight-decay", type=float, default=0.01)
    tb.add_argument("--clip-grad", type=float, default=1.0)
    tb.add_argument("--no-foreach", action="store_true", help="per-tensor AdamW loop instead of foreach kernels")
    tb.set_defaults(func=cmd_train_bench)

    ev = sub.add_parser("eval", help="mean next-token loss of an HF GPT-2 HDF5 state dict; print one JSON line")
    ev.add_argument("--hf-h5", required=True)
    ev.add_argument("--data-prefix", required=True)
    ev.add_argument("--seq-length", type=int, required=True)
    ev.add_argument("--samples", type=int, default=None, help="number of windows (default: all)")
    ev.add_argument("--double", action="store_true", help="compute in float64")
    ev.add_argument("--batch-size", type=int, default=8)
    ev.add_argument("--num-attention-heads", type=int, default=None,
                    help="needed only when the file lacks an n_head attribute and hidden size is not 64*heads")
    ev.add_argument("--threads", type=int, default=None)
    ev.set_defaults(func=cmd_eval)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
