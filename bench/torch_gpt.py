#!/usr/bin/python3
"""PyTorch peer of troupe's GPT-2: speed-benchmark comparison and outside numerical oracle.

Run with Debian's interpreter (/usr/bin/python3: torch, numpy, h5py); the pyenv `python3` on PATH has no torch.

Subcommands:
  train-bench  time fp32 training steps (AdamW, grad clipping) of a GPT-2 model (or with --model llama a LLaMA:
               RMSNorm, rotary, grouped-query attention, SwiGLU, no biases, untied head; or with --num-experts E
               --topk k a GPT-2 whose every MLP is a dropless top-k mixture of E GELU experts), print one JSON line.
  eval         load a Hugging Face GPT2LMHeadModel state dict stored in HDF5 (`troupe ckpt export --format hf-h5`) or a
               Hugging Face folder of a GPT2LMHeadModel, LlamaForCausalLM or BloomForCausalLM (`--format hf`), compute
               the mean next-token loss over fixed windows of a Megatron MMIDIDX dataset (or a raw int32 token file),
               print one JSON line.

The GPT-2 model matches troupe's exactly: pre-LayerNorm blocks (eps 1e-5), learned position embeddings, token embedding tied
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


# train-bench --device cuda: attention through F.scaled_dot_product_attention (what PyTorch's GPT-2s on a GPU
# use) instead of the explicit softmax the CPU oracle keeps.
_FUSED_ATTENTION = False


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
            if _FUSED_ATTENTION:  # the GPU benchmark: PyTorch's own flash / memory-efficient kernels
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q * (1.0 / math.sqrt(hs))) @ k.transpose(-2, -1)  # (B, H, T, T)
                att = att.masked_fill(~self.causal_mask[:, :, :T, :T], float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v  # (B, H, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self, n_embd, ffn=None):
            super().__init__()
            ffn = 4 * n_embd if ffn is None else ffn
            self.c_fc = nn.Linear(n_embd, ffn)
            self.c_proj = nn.Linear(ffn, n_embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class MoE(nn.Module):
        """A mixture-of-experts MLP as PyTorch users write one (Megatron-Core's top-k router, dropless): a linear
        router, softmax over the experts, torch.topk with the k probabilities renormalised, each expert's tokens
        gathered by index_select, its GELU MLP, the weighted outputs summed back with index_add_. aux_loss: the
        switch load-balancing loss E / (k S^2) sum_e (sum_s p_se) * tokens_e (Megatron-Core's switch_load_balancing
        _loss_func), kept for the model to add."""

        def __init__(self, n_embd, n_experts, topk, ffn):
            super().__init__()
            self.n_experts, self.topk = n_experts, topk
            self.router = nn.Linear(n_embd, n_experts)  # troupe's Megatron router has a bias when the linears do
            self.experts = nn.ModuleList([MLP(n_embd, ffn) for _ in range(n_experts)])
            self.aux_loss = None

        def forward(self, x):
            B, T, C = x.shape
            flat = x.reshape(-1, C)  # (S, C)
            probs = F.softmax(self.router(flat), dim=-1)  # (S, E)
            weights, chosen = torch.topk(probs, self.topk, dim=-1)  # (S, k)
            weights = weights / weights.sum(dim=-1, keepdim=True)
            out = torch.zeros_like(flat)
            for e, expert in enumerate(self.experts):
                token, slot = torch.where(chosen == e)
                if token.numel() == 0:
                    continue
                y = expert(flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)
                out.index_add_(0, token, y)
            tokens_per_expert = torch.bincount(chosen.flatten(), minlength=self.n_experts)
            S = flat.shape[0]
            self.aux_loss = (probs.sum(dim=0) * tokens_per_expert).sum() * (self.n_experts / (self.topk * S * S))
            return out.view(B, T, C)

    class Block(nn.Module):
        def __init__(self, n_embd, n_head, n_positions, eps, moe=None):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
            self.attn = CausalSelfAttention(n_embd, n_head, n_positions)
            self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
            self.mlp = MLP(n_embd) if moe is None else MoE(n_embd, *moe)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    class GPT(nn.Module):
        """GPT-2 with Hugging Face parameter names (nn.Linear orientation: weights are (out, in)).

        vocab_size: rows of wte (and logits computed); real_vocab: how many of them the loss uses (troupe masks the
        padding rows out of the softmax), default all. moe: (experts, k, expert ffn, aux loss coefficient) makes every
        layer's MLP a MoE; the loss then adds the coefficient times the sum of the layers' load-balancing losses.
        """

        def __init__(self, n_layer, n_embd, n_head, n_positions, vocab_size, real_vocab=None, eps=1e-5, moe=None):
            super().__init__()
            self.aux_loss_coeff = 0.0 if moe is None else moe[3]
            self.n_layer, self.n_embd, self.n_head = n_layer, n_embd, n_head
            self.n_positions, self.vocab_size = n_positions, vocab_size
            self.real_vocab = vocab_size if real_vocab is None else real_vocab
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(vocab_size, n_embd),
                    wpe=nn.Embedding(n_positions, n_embd),
                    h=nn.ModuleList([Block(n_embd, n_head, n_positions, eps, None if moe is None else moe[:3])
                                     for _ in range(n_layer)]),
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
            if self.aux_loss_coeff != 0:
                loss = loss + self.aux_loss_coeff * sum(block.mlp.aux_loss for block in self.transformer.h)
            return logits, loss

    return GPT


def build_llama_class():
    """A LLaMA written the way PyTorch users write it (Hugging Face's LlamaForCausalLM layout and names), for the
    speed benchmark: RMSNorm in torch ops, rotate-half rotary as HF's apply_rotary_pos_emb, grouped-query attention
    by repeat_interleave of the key/value heads, SwiGLU as silu(gate_proj) * up_proj, no linear biases, an untied
    lm_head. Float32 training only; the float64 eval oracle is HfCausalLM below, kept apart."""
    _import_torch()

    class RMSNorm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Attention(nn.Module):
        def __init__(self, n_embd, n_head, n_group, n_positions, base):
            super().__init__()
            assert n_embd % n_head == 0 and n_head % n_group == 0, "heads divide hidden, groups divide heads"
            self.n_head, self.n_group, self.hd = n_head, n_group, n_embd // n_head
            self.q_proj = nn.Linear(n_embd, n_head * self.hd, bias=False)
            self.k_proj = nn.Linear(n_embd, n_group * self.hd, bias=False)
            self.v_proj = nn.Linear(n_embd, n_group * self.hd, bias=False)
            self.o_proj = nn.Linear(n_head * self.hd, n_embd, bias=False)
            # HF's LlamaRotaryEmbedding: inv_freq = base^(-2i/hd), the angles of [freqs | freqs] for rotate_half.
            inv_freq = 1.0 / (base ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
            emb = torch.outer(torch.arange(n_positions, dtype=torch.float32), inv_freq).repeat(1, 2)
            self.register_buffer("cos", emb.cos(), persistent=False)  # (P, hd)
            self.register_buffer("sin", emb.sin(), persistent=False)
            mask = torch.ones(n_positions, n_positions, dtype=torch.bool).tril()
            self.register_buffer("causal_mask", mask.view(1, 1, n_positions, n_positions), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            H, G, hd = self.n_head, self.n_group, self.hd
            q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
            k = self.k_proj(x).view(B, T, G, hd).transpose(1, 2)  # (B, G, T, hd)
            v = self.v_proj(x).view(B, T, G, hd).transpose(1, 2)
            cos, sin = self.cos[:T], self.sin[:T]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(H // G, dim=1)  # head h reads group h // (H / G), as HF's repeat_kv
            v = v.repeat_interleave(H // G, dim=1)
            att = (q * (1.0 / math.sqrt(hd))) @ k.transpose(-2, -1)  # (B, H, T, T)
            att = att.masked_fill(~self.causal_mask[:, :, :T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v  # (B, H, T, hd)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))

    class MLP(nn.Module):
        def __init__(self, n_embd, ffn):
            super().__init__()
            self.gate_proj = nn.Linear(n_embd, ffn, bias=False)
            self.up_proj = nn.Linear(n_embd, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, n_embd, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self, n_embd, n_head, n_group, ffn, n_positions, eps, base):
            super().__init__()
            self.input_layernorm = RMSNorm(n_embd, eps)
            self.self_attn = Attention(n_embd, n_head, n_group, n_positions, base)
            self.post_attention_layernorm = RMSNorm(n_embd, eps)
            self.mlp = MLP(n_embd, ffn)

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self, n_layer, n_embd, n_head, n_group, ffn, n_positions, vocab_size, eps=1e-5, base=10000.0):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab_size, n_embd)
            self.layers = nn.ModuleList(
                [Block(n_embd, n_head, n_group, ffn, n_positions, eps, base) for _ in range(n_layer)])
            self.norm = RMSNorm(n_embd, eps)
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            for name, p in self.named_parameters():  # normal(0.02), the residual projections scaled (Megatron)
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                    nn.init.normal_(p, mean=0.0, std=std)

        def forward(self, idx, targets=None):
            x = self.embed_tokens(idx)
            for block in self.layers:
                x = block(x)
            logits = self.lm_head(self.norm(x))
            if targets is None:
                return logits, None
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return Llama


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
# Hugging Face folders (config.json + model.safetensors): GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM,
# BloomForCausalLM.
#
# Written from the published architectures (Hugging Face's modeling_gpt2 / modeling_llama / modeling_mixtral /
# modeling_bloom semantics), not from troupe's code, as plain functions over a dict of float64 tensors:
#   LLaMA  x = embed_tokens[ids]; per layer: h = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),
#          n = RMSNorm_in(x) (x * rsqrt(mean(x^2) + eps) * w); x = h + down_proj(silu(gate_proj(m)) * up_proj(m)),
#          m = RMSNorm_post(h); logits = lm_head(RMSNorm(x)) (lm_head = embed_tokens when tied). rope: rotate-half
#          (HF's rotate_half/apply_rotary_pos_emb), inv_freq = rope_theta^(-2i/head_dim); key/value head g serves
#          query heads [g H/G, (g+1) H/G) (repeat_kv).
#   Mixtral  LLaMA's layer with the MLP replaced by the sparse MoE block (MixtralSparseMoeBlock) on m:
#          router_logits = gate(m) (E per token); p = softmax over all E experts; the top num_experts_per_tok
#          experts by p, their p renormalised to sum to 1; y = sum over the chosen e of p_e * w2_e(silu(w1_e m) *
#          w3_e m). Evaluation: no router jitter, no capacity (every chosen expert computes its tokens).
#   BLOOM  x = LayerNorm_emb(word_embeddings[ids]); per layer: qkv = query_key_value(LayerNorm_in(x)) viewed
#          (B, T, H, 3, hs) (per head [q k v]); scores = q k^T / sqrt(hs) + slope_h * j (build_alibi_tensor: the key
#          position; constant along a row, so softmax equals slope_h (j - i)); h = x + dense(attn); x = h +
#          dense_4h_to_h(gelu(dense_h_to_4h(LayerNorm_post(h)))); logits = word_embeddings(ln_f(x)). GELU: the tanh
#          form with the exact sqrt(2/pi) (HF's bloom_gelu_forward rounds it to 0.79788456, 1e-9 relative).

_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}


def read_safetensors(path):
    """{name: numpy array} of a .safetensors file: u64 LE header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than a safetensors header")
    n = int.from_bytes(blob[:8], "little")
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(blob[8: 8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry["dtype"]
        if dtype == "BF16":
            begin, end = entry["data_offsets"]
            raw = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            out[name] = raw.view(np.float32).reshape(entry["shape"])
            continue
        if dtype not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}, which this reader does not know")
        begin, end = entry["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=_ST_DTYPES[dtype])
        out[name] = arr.reshape(entry["shape"])
    return out


def read_hf_folder_tensors(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(folder, name)))
    return tensors


class HfCausalLM:
    """A GPT-2, LLaMA, Mixtral or BLOOM of a Hugging Face folder in float64 (or float32); __call__ returns
    (logits, loss)."""

    def __init__(self, folder, dtype):
        _import_torch()
        with open(os.path.join(folder, "config.json")) as f:
            self.config = json.load(f)
        self.kind = self.config.get("model_type")
        if self.kind not in ("gpt2", "llama", "mixtral", "bloom"):
            raise ValueError(f"{folder}: model_type {self.kind!r} is not gpt2, llama, mixtral or bloom")
        raw = read_hf_folder_tensors(folder)
        self.w = {k: torch.from_numpy(np.array(v, dtype=np.float64)).to(dtype) for k, v in raw.items()}
        c = self.config
        if self.kind == "gpt2":
            self.w = {k if k.startswith(("transformer.", "lm_head")) else "transformer." + k: v for k, v in self.w.items()}
            self.n_layer, self.n_head, self.hidden = c["n_layer"], c["n_head"], c["n_embd"]
            self.eps = c.get("layer_norm_epsilon", 1e-5)
            self.positions = c["n_positions"]
            self.vocab_size = c["vocab_size"]
            self.embed = self.w["transformer.wte.weight"]
        elif self.kind in ("llama", "mixtral"):
            mixtral = self.kind == "mixtral"
            self.n_layer, self.n_head = c["num_hidden_layers"], c["num_attention_heads"]
            self.hidden = c["hidden_size"]
            self.n_kv = c.get("num_key_value_heads") or (8 if mixtral else self.n_head)  # the configs' defaults
            self.head_dim = c.get("head_dim") or self.hidden // self.n_head
            self.eps = c.get("rms_norm_eps", 1e-5 if mixtral else 1e-6)
            self.theta = float(c.get("rope_theta", 1e6 if mixtral else 10000.0))
            self.positions = c.get("max_position_embeddings", 4096 * 32 if mixtral else 2048)
            self.vocab_size = c["vocab_size"]
            if c.get("hidden_act", "silu") != "silu":
                raise ValueError(f"{folder}: hidden_act {c.get('hidden_act')!r}: only silu is LLaMA's and Mixtral's")
            if c.get("rope_scaling") is not None:
                raise ValueError(f"{folder}: rope_scaling is not modelled here")
            if mixtral:
                self.n_experts = c.get("num_local_experts", 8)
                self.topk = c.get("num_experts_per_tok", 2)
                self.window = c.get("sliding_window")  # None: every earlier position (checked against T below)
            self.embed = self.w["model.embed_tokens.weight"]
        else:
            self.n_layer = c.get("n_layer", c.get("num_hidden_layers"))
            self.n_head = c.get("n_head", c.get("num_attention_heads"))
            self.hidden = c.get("hidden_size", c.get("n_embed"))
            self.eps = c.get("layer_norm_epsilon", 1e-5)
            self.positions = None  # ALiBi: no position limit
            self.vocab_size = c["vocab_size"]
            if c.get("apply_residual_connection_post_layernorm", False):
                raise ValueError(f"{folder}: apply_residual_connection_post_layernorm is not modelled here")
            self.embed = self.w["transformer.word_embeddings.weight"]
        tied = c.get("tie_word_embeddings", True)
        self.head = self.w.get("lm_head.weight") if not tied or "lm_head.weight" in self.w else None
        if self.head is None:
            self.head = self.embed
        self.real_vocab = self.vocab_size

    # -- pieces -------------------------------------------------------------------------------------------------------
    def _linear(self, x, name, bias=True):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y + b if b is not None else y

    def _linear_conv1d(self, x, name):  # GPT-2's Conv1D: weight (in, out)
        return x @ self.w[name + ".weight"] + self.w[name + ".bias"]

    def _layernorm(self, x, name):
        return F.layer_norm(x, (x.shape[-1],), self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def _rmsnorm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name + ".weight"]

    @staticmethod
    def _causal_softmax(scores):
        T = scores.shape[-1]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)

    def _rope(self, x):  # x (B, heads, T, hd): rotate-half pairs (i, i + hd/2), angle t * theta^(-2i/hd)
        T, hd = x.shape[2], x.shape[3]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        rotated = torch.cat((-x[..., hd // 2:], x[..., : hd // 2]), dim=-1)
        return x * cos + rotated * sin

    @staticmethod
    def alibi_slopes(n):
        """BLOOM's build_alibi_tensor slopes: a power of 2 below n, then odd powers of the next one's base."""
        closest = 2 ** math.floor(math.log2(n))
        base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
        slopes = [base ** p for p in range(1, closest + 1)]
        if closest != n:
            extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
            slopes += [extra ** p for p in range(1, 1 + 2 * min(closest, n - closest), 2)]
        return slopes

    # -- blocks -------------------------------------------------------------------------------------------------------
    def _gpt2_layer(self, x, i):
        p = f"transformer.h.{i}."
        B, T, C = x.shape
        H = self.n_head
        hs = C // H
        q, k, v = self._linear_conv1d(self._layernorm(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
        y = self._causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(hs)) @ v
        x = x + self._linear_conv1d(y.transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        m = self._linear_conv1d(self._layernorm(x, p + "ln_2"), p + "mlp.c_fc")
        return x + self._linear_conv1d(F.gelu(m, approximate="tanh"), p + "mlp.c_proj")

    def _llama_layer(self, x, i):
        p = f"model.layers.{i}."
        B, T, _ = x.shape
        H, G, hd = self.n_head, self.n_kv, self.head_dim
        n = self._rmsnorm(x, p + "input_layernorm")
        q = self._linear(n, p + "self_attn.q_proj").view(B, T, H, hd).transpose(1, 2)
        k = self._linear(n, p + "self_attn.k_proj").view(B, T, G, hd).transpose(1, 2)
        v = self._linear(n, p + "self_attn.v_proj").view(B, T, G, hd).transpose(1, 2)
        q, k = self._rope(q), self._rope(k)
        k = k.repeat_interleave(H // G, dim=1)  # head h reads group h // (H / G)
        v = v.repeat_interleave(H // G, dim=1)
        y = self._causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(hd)) @ v
        h = x + self._linear(y.transpose(1, 2).reshape(B, T, H * hd), p + "self_attn.o_proj")
        m = self._rmsnorm(h, p + "post_attention_layernorm")
        if self.kind == "mixtral":
            return h + self._sparse_moe(m, p + "block_sparse_moe.")
        gated = F.silu(self._linear(m, p + "mlp.gate_proj")) * self._linear(m, p + "mlp.up_proj")
        return h + self._linear(gated, p + "mlp.down_proj")

    def _sparse_moe(self, m, p):
        """Mixtral's block: softmax over all experts, the top k, renormalised; each chosen expert's SwiGLU."""
        probs = F.softmax(self._linear(m, p + "gate"), dim=-1)  # (B, T, E)
        weights, chosen = torch.topk(probs, self.topk, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        combine = torch.zeros_like(probs).scatter(-1, chosen, weights)  # (B, T, E): 0 for the others
        y = torch.zeros_like(m)
        for e in range(self.n_experts):
            x = f"{p}experts.{e}."
            expert = self._linear(F.silu(self._linear(m, x + "w1")) * self._linear(m, x + "w3"), x + "w2")
            y = y + combine[..., e: e + 1] * expert
        return y

    def _bloom_layer(self, x, i, alibi):
        p = f"transformer.h.{i}."
        B, T, C = x.shape
        H = self.n_head
        hs = C // H
        qkv = self._linear(self._layernorm(x, p + "input_layernorm"), p + "self_attention.query_key_value")
        qkv = qkv.view(B, T, H, 3, hs)
        q, k, v = (qkv[..., j, :].transpose(1, 2) for j in range(3))  # (B, H, T, hs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs) + alibi  # alibi (H, 1, T): slope_h * key position
        y = self._causal_softmax(scores) @ v
        h = x + self._linear(y.transpose(1, 2).reshape(B, T, C), p + "self_attention.dense")
        m = self._linear(self._layernorm(h, p + "post_attention_layernorm"), p + "mlp.dense_h_to_4h")
        return h + self._linear(F.gelu(m, approximate="tanh"), p + "mlp.dense_4h_to_h")

    def __call__(self, idx, targets=None, reduction="mean"):
        B, T = idx.shape
        if self.positions is not None and T > self.positions:
            raise ValueError(f"sequence length {T} exceeds the model's {self.positions} positions")
        x = F.embedding(idx, self.embed)
        if self.kind == "gpt2":
            x = x + self.w["transformer.wpe.weight"][:T]
            for i in range(self.n_layer):
                x = self._gpt2_layer(x, i)
            x = self._layernorm(x, "transformer.ln_f")
        elif self.kind in ("llama", "mixtral"):
            if self.kind == "mixtral" and self.window is not None and T > self.window:
                raise ValueError(f"sequence length {T} exceeds the sliding window {self.window}: not modelled here")
            for i in range(self.n_layer):
                x = self._llama_layer(x, i)
            x = self._rmsnorm(x, "model.norm")
        else:
            x = self._layernorm(x, "transformer.word_embeddings_layernorm")
            slopes = torch.tensor(self.alibi_slopes(self.n_head), dtype=x.dtype)
            alibi = slopes.view(-1, 1, 1) * torch.arange(T, dtype=x.dtype).view(1, 1, T)
            for i in range(self.n_layer):
                x = self._bloom_layer(x, i, alibi)
            x = self._layernorm(x, "transformer.ln_f")
        logits = x @ self.head.T
        if targets is None:
            return logits, None
        flat = logits.reshape(-1, logits.size(-1))[:, : self.real_vocab]
        return logits, F.cross_entropy(flat, targets.reshape(-1), reduction=reduction)


# ----------------------------------------------------------------------------------------------------------------------
# Subcommands.


def _set_thread_env(threads):
    # Before importing torch: OpenMP (ATen) and OpenBLAS (Debian's torch links OpenBLAS) read these at start-up.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


def model_flops_per_iter(B, s, l, h, V, heads, groups=None, ffn=None, swiglu=False, divisible_by=128, experts=0,
                         topk=0):
    """Model FLOPs of one forward + backward without recomputation, in the form of Megatron-LM's
    num_floating_point_operations (megatron/training/training.py): 12 B s l h^2 [(1 + G/H + s/2h) q/h
    + (F/h) g + Vp/(2 l h)], q = H (h/H) the query width, g = 3/2 with SwiGLU, Vp the vocabulary padded to a
    multiple of 128; the attention scores counted over the causal half (s/2h). With experts (every layer an MoE
    of `experts` experts of width ffn, top-k) the MLP term is what one token computes: k experts' F g and the
    router's E/2 (an E-wide GEMM, 2 h E per token where the MLP is 4 h F g). troupe's GptConfig::
    flops_per_iteration is the same count written GEMM by GEMM; run_vs_pytorch.sh checks the two agree."""
    groups = heads if groups is None else groups
    ffn = 4 * h if ffn is None else ffn
    q = heads * (h // heads)
    Vp = -(-V // divisible_by) * divisible_by
    gated = 1.5 if swiglu else 1.0
    mlp = ffn * gated if experts == 0 else topk * ffn * gated + experts / 2.0
    return 12.0 * B * s * l * h * h * ((1.0 + groups / heads + s / (2.0 * h)) * q / h + mlp / h
                                       + Vp / (2.0 * l * h))


def cmd_train_bench(args):
    global _FUSED_ATTENTION
    _set_thread_env(args.threads)
    GPT = build_model_classes()
    device = torch.device(args.device)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: this PyTorch sees no GPU")
        _FUSED_ATTENTION = True
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    elif args.dtype != "fp32" or args.compile:
        raise SystemExit("--dtype bf16 and --compile are for --device cuda")
    if args.model != "llama" and (args.num_query_groups or args.ffn_hidden_size):
        raise SystemExit("--num-query-groups and --ffn-hidden-size are LLaMA's -- add --model llama or drop them")
    if args.num_experts < 0 or (args.num_experts > 0 and not 1 <= args.topk <= args.num_experts):
        raise SystemExit("--num-experts must be >= 0 and --topk 1 to --num-experts -- pass e.g. --num-experts 8 --topk 2")
    if args.num_experts > 0 and args.model == "llama":
        raise SystemExit("--num-experts: the MoE variant is GPT-2's (GELU experts) -- drop --model llama")
    if args.num_experts == 0 and (args.moe_ffn_hidden_size or args.moe_aux_loss_coeff):
        raise SystemExit("--moe-ffn-hidden-size and --moe-aux-loss-coeff need --num-experts")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    B, S = args.micro_batch_size, args.seq_length

    llama = args.model == "llama"
    n_groups = args.num_query_groups or args.num_attention_heads
    ffn = args.ffn_hidden_size or 4 * args.hidden_size
    if args.num_experts > 0:
        ffn = args.moe_ffn_hidden_size or 4 * args.hidden_size
        moe = (args.num_experts, args.topk, ffn, args.moe_aux_loss_coeff)
        model = GPT(args.num_layers, args.hidden_size, args.num_attention_heads, S, args.vocab_size, moe=moe)
    elif llama:
        model = build_llama_class()(args.num_layers, args.hidden_size, args.num_attention_heads, n_groups, ffn, S,
                                    args.vocab_size, eps=args.norm_epsilon, base=args.rotary_base)
    else:
        model = GPT(args.num_layers, args.hidden_size, args.num_attention_heads, S, args.vocab_size)
    model.to(device)
    model.train()
    step_model = torch.compile(model) if args.compile else model

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
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if args.dtype == "bf16":  # autocast: fp32 master weights and optimizer, bf16 GEMMs and activations
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                _, loss = step_model(x, y)
        else:
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device == "cuda" and it + 1 == args.warmup_iters:
            torch.cuda.synchronize()  # the warm-up (and compilation) ends before the clock starts
            t0 = time.perf_counter()
    if args.device == "cuda":
        torch.cuda.synchronize()
    final_loss = loss.item()
    elapsed = time.perf_counter() - (t0 if t0 is not None else time.perf_counter())

    iters = args.iters
    ms_per_iter = 1000.0 * elapsed / iters if iters > 0 else float("nan")
    tokens_per_sec = B * S * iters / elapsed if iters > 0 and elapsed > 0 else float("nan")
    flops = model_flops_per_iter(B, S, args.num_layers, args.hidden_size, args.vocab_size, args.num_attention_heads,
                                 n_groups, ffn, swiglu=llama, experts=args.num_experts, topk=args.topk)
    out = {
        "impl": "pytorch",
        "torch_version": torch.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "compile": args.compile,
        "threads": args.threads,
        "tokens_per_sec": tokens_per_sec,
        "ms_per_iter": ms_per_iter,
        "iters": iters,
        "final_loss": final_loss,
        "model_flops_per_iter": flops,
        "model_tflops": flops / (ms_per_iter / 1000.0) / 1e12 if iters > 0 else float("nan"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": {
            "model": args.model, "num_query_groups": n_groups, "ffn_hidden_size": ffn,
            "num_layers": args.num_layers, "hidden_size": args.hidden_size,
            "num_attention_heads": args.num_attention_heads, "seq_length": S, "micro_batch_size": B,
            "vocab_size": args.vocab_size, "warmup_iters": args.warmup_iters,
            "num_experts": args.num_experts, "topk": args.topk if args.num_experts else 0,
            "moe_aux_loss_coeff": args.moe_aux_loss_coeff,
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
    if (args.hf_h5 is None) == (args.hf_dir is None):
        raise SystemExit("pass exactly one of --hf-h5 FILE and --hf-dir FOLDER")
    if (args.data_prefix is None) == (args.token_file is None):
        raise SystemExit("pass exactly one of --data-prefix PREFIX and --token-file FILE")
    if args.hf_h5 is not None:
        model = load_hf_h5(args.hf_h5, dtype, args.num_attention_heads)
        model.eval()
        positions = model.n_positions
    else:
        model = HfCausalLM(args.hf_dir, dtype)
        positions = model.positions
    S = args.seq_length
    if positions is not None and S > positions:
        raise SystemExit(f"--seq-length {S} exceeds the model's {positions} positions")

    if args.token_file is not None:  # raw little-endian int32 tokens
        stream = np.fromfile(args.token_file, dtype="<i4")
    else:
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
    tb.add_argument("--model", choices=("gpt2", "llama"), default="gpt2",
                    help="gpt2: the GPT-2 above; llama: RMSNorm, rotary, GQA, SwiGLU, no biases, untied head")
    tb.add_argument("--num-layers", type=int, default=4)
    tb.add_argument("--hidden-size", type=int, default=384)
    tb.add_argument("--num-attention-heads", type=int, default=6)
    tb.add_argument("--seq-length", type=int, default=256)
    tb.add_argument("--micro-batch-size", type=int, default=8)
    tb.add_argument("--vocab-size", type=int, default=50304)
    tb.add_argument("--num-query-groups", type=int, default=None, help="LLaMA: key/value heads (default: heads)")
    tb.add_argument("--ffn-hidden-size", type=int, default=None, help="LLaMA: the SwiGLU width (default: 4 x hidden)")
    tb.add_argument("--rotary-base", type=float, default=10000.0, help="LLaMA: rope_theta")
    tb.add_argument("--norm-epsilon", type=float, default=1e-5, help="LLaMA: the RMSNorms' epsilon")
    tb.add_argument("--num-experts", type=int, default=0,
                    help="GPT-2 with every MLP a mixture of this many GELU experts (dropless top-k router)")
    tb.add_argument("--topk", type=int, default=2, help="MoE: experts per token")
    tb.add_argument("--moe-ffn-hidden-size", type=int, default=None, help="MoE: each expert's width (default 4 x hidden)")
    tb.add_argument("--moe-aux-loss-coeff", type=float, default=0.0, help="MoE: the load-balancing loss's coefficient")
    tb.add_argument("--threads", type=int, default=2)
    tb.add_argument("--warmup-iters", type=int, default=2)
    tb.add_argument("--iters", type=int, default=10)
    tb.add_argument("--data-prefix", default=None, help="MMIDIDX dataset prefix (P.bin/P.idx); random tokens if absent")
    tb.add_argument("--seed", type=int, default=1234)
    tb.add_argument("--lr", type=float, default=1e-4)
    tb.add_argument("--weight-decay", type=float, default=0.01)
    tb.add_argument("--clip-grad", type=float, default=1.0)
    tb.add_argument("--no-foreach", action="store_true", help="per-tensor AdamW loop instead of foreach kernels")
    tb.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    tb.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="cuda: bf16 autocast")
    tb.add_argument("--compile", action="store_true", help="cuda: torch.compile the model")
    tb.add_argument("--tf32", action="store_true", help="cuda: TF32 GEMMs for fp32")
    tb.set_defaults(func=cmd_train_bench)

    ev = sub.add_parser("eval", help="mean next-token loss of an HF GPT-2 HDF5 state dict or an HF folder (GPT-2, "
                                     "LLaMA, BLOOM); print one JSON line")
    ev.add_argument("--hf-h5", default=None, help="HDF5 GPT2LMHeadModel state dict (troupe ckpt export --format hf-h5)")
    ev.add_argument("--hf-dir", default=None, help="Hugging Face folder: config.json + model.safetensors")
    ev.add_argument("--data-prefix", default=None, help="MMIDIDX dataset prefix")
    ev.add_argument("--token-file", default=None, help="raw little-endian int32 token stream instead of a dataset")
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
