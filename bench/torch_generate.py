#!/usr/bin/env python3
"""GPT-2 or LLaMA greedy decoding in PyTorch with a key/value cache, the peer of `troupe generate
--timing` (bench/generate_vs_pytorch.sh): the weights of a Hugging Face GPT-2 or LLaMA folder (a troupe
export) in float32, torch.no_grad(), the attention as matrix products (Debian's torch has no
scaled_dot_product_attention; LLaMA: RMSNorm, rotate-half rotary from a precomputed table, grouped-query
attention by repeating the key/value heads as Hugging Face's modeling_llama does, SwiGLU, untied head),
the prompts fed at once (time to first token), then one token per sequence per step against the cache. Prints one JSON object: prefill_seconds, decode_seconds, tokens,
tokens_per_second and the generated token ids (to check they are troupe's).

  torch_generate.py --hf-dir DIR --prompt-ids JSON --batch B --tokens N [--threads T]
"""
import argparse
import json
import math
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf-dir", required=True)
    ap.add_argument("--prompt-ids", required=True, help="a JSON list of token ids")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import torch.nn.functional as F
    import torch_gpt

    torch.set_num_threads(a.threads)
    w = {k: torch.tensor(v, dtype=torch.float32) for k, v in torch_gpt.read_hf_folder_tensors(a.hf_dir).items()}
    cfg = json.load(open(os.path.join(a.hf_dir, "config.json")))
    if cfg.get("model_type") == "llama":
        return run(a, torch, llama_forward(torch, F, w, cfg), cfg["num_hidden_layers"], cfg["vocab_size"])
    w = {(k if k.startswith("transformer.") or k == "lm_head.weight" else "transformer." + k): v for k, v in w.items()}
    L, C, H = cfg["n_layer"], cfg["n_embd"], cfg["n_head"]
    hs, eps, V = C // H, cfg.get("layer_norm_epsilon", 1e-5), cfg["vocab_size"]
    wte, wpe = w["transformer.wte.weight"], w["transformer.wpe.weight"]

    def ln(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], eps)

    def conv1d(x, name):
        return torch.addmm(w[name + ".bias"], x.reshape(-1, x.shape[-1]), w[name + ".weight"]).view(*x.shape[:-1], -1)

    def forward(ids, pos0, cache):
        """ids (B, T); cache: per layer [k, v] of (B, H, pos0, hs); returns the last position's logits."""
        B, T = ids.shape
        x = wte[ids] + wpe[pos0:pos0 + T]
        for i in range(L):
            p = f"transformer.h.{i}."
            q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
            q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
            if cache[i] is not None:
                k = torch.cat((cache[i][0], k), dim=2)
                v = torch.cat((cache[i][1], v), dim=2)
            cache[i] = (k, v)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            if T > 1:  # the prompt: causal among its own rows (nothing cached before it)
                scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
            x = x + conv1d(y.transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
            m = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
            x = x + conv1d(F.gelu(m, approximate="tanh"), p + "mlp.c_proj")
        return F.linear(ln(x[:, -1, :], "transformer.ln_f"), wte)  # as GPT2LMHeadModel's lm_head

    return run(a, torch, forward, L, V)


def llama_forward(torch, F, w, cfg):
    L, C, H = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    G = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or C // H
    eps, theta = cfg.get("rms_norm_eps", 1e-6), float(cfg.get("rope_theta", 10000.0))
    positions = cfg.get("max_position_embeddings", 2048)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos_table, sin_table = emb.cos().float(), emb.sin().float()
    embed = w["model.embed_tokens.weight"]
    head = w.get("lm_head.weight", embed)

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name + ".weight"]

    def rope(x, pos0):  # x (B, heads, T, hd)
        T = x.shape[2]
        cos, sin = cos_table[pos0:pos0 + T], sin_table[pos0:pos0 + T]
        return x * cos + torch.cat((-x[..., hd // 2:], x[..., : hd // 2]), dim=-1) * sin

    def forward(ids, pos0, cache):
        B, T = ids.shape
        x = embed[ids]
        for i in range(L):
            p = f"model.layers.{i}."
            n = rms(x, p + "input_layernorm")
            q = F.linear(n, w[p + "self_attn.q_proj.weight"]).view(B, T, H, hd).transpose(1, 2)
            k = F.linear(n, w[p + "self_attn.k_proj.weight"]).view(B, T, G, hd).transpose(1, 2)
            v = F.linear(n, w[p + "self_attn.v_proj.weight"]).view(B, T, G, hd).transpose(1, 2)
            q, k = rope(q, pos0), rope(k, pos0)
            if cache[i] is not None:
                k = torch.cat((cache[i][0], k), dim=2)
                v = torch.cat((cache[i][1], v), dim=2)
            cache[i] = (k, v)
            kr, vr = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
            scores = (q @ kr.transpose(-2, -1)) / math.sqrt(hd)
            if T > 1:
                scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
            y = torch.softmax(scores, dim=-1) @ vr
            x = x + F.linear(y.transpose(1, 2).reshape(B, T, H * hd), w[p + "self_attn.o_proj.weight"])
            m = rms(x, p + "post_attention_layernorm")
            gated = F.silu(F.linear(m, w[p + "mlp.gate_proj.weight"])) * F.linear(m, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(gated, w[p + "mlp.down_proj.weight"])
        return F.linear(rms(x[:, -1, :], "model.norm"), head)

    return forward


def run(a, torch, forward, L, V):
    prompt = json.loads(a.prompt_ids)
    ids = torch.tensor([prompt] * a.batch, dtype=torch.long)
    out = []
    with torch.no_grad():
        cache = [None] * L
        t0 = time.perf_counter()
        logits = forward(ids, 0, cache)
        nxt = logits[:, :V].argmax(-1)
        t1 = time.perf_counter()
        out.append(nxt)
        pos = len(prompt)
        for _ in range(a.tokens - 1):
            logits = forward(nxt.view(-1, 1), pos, cache)
            nxt = logits[:, :V].argmax(-1)
            out.append(nxt)
            pos += 1
        t2 = time.perf_counter()
    tokens = torch.stack(out, dim=1).tolist()
    decoded = a.batch * (a.tokens - 1)
    print(json.dumps({"prefill_seconds": t1 - t0, "decode_seconds": t2 - t1, "tokens": decoded,
                      "tokens_per_second": decoded / (t2 - t1), "generated": tokens[0]}))


if __name__ == "__main__":
    main()
