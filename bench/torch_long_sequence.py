#!/usr/bin/python3
"""The longest sequence PyTorch trains one iteration of, in one process, under a memory limit (issue 29, item 4).

The PyTorch side of bench/long_sequence_memory.sh --longest: the same GPT-2 as its troupe runs (default 4 layers,
hidden 512, 8 heads, vocabulary 512, micro-batch 1, learned positions as long as the sequence, tied head, no dropout),
written as PyTorch users write it: pre-LayerNorm blocks (eps 1e-5), fused c_attn [q | k | v], causal softmax attention
from torch ops (q k^T / sqrt(d) as one (B, H, T, T) tensor, masked_fill with one boolean causal mask shared by the
layers, F.softmax, @ v), tanh-GELU MLP of width 4 x hidden, biases on every linear, F.cross_entropy, AdamW (lr 6e-4,
weight decay 0.01), gradient clipping 1.0, float32 on the CPU. Nothing recomputed, no fused attention (Debian's
PyTorch 1.13 has no scaled_dot_product_attention), so the attention probabilities of every layer, (H x T x T) floats
each, stay for the backward.

  /usr/bin/python3 bench/torch_long_sequence.py --seq 2048          # one try: train 1 iteration, print one line
  /usr/bin/python3 bench/torch_long_sequence.py --longest           # search under --mem-limit (default 22G)
      [--start 4096] [--granule 128] [--max-seq N] [--mem-limit 22G] [--time-limit 1800]
      [--limit-method auto|systemd|watch|prlimit|none] [--scratch DIR] [--json]
  model flags (both modes): --num-layers 4 --hidden-size 512 --num-attention-heads 8 --vocab-size 512
      --micro-batch-size 1 --threads N (default: all cores) --dropout P (default 0) --seed S

--longest runs each try as a child process (this script with --seq N) under bench/limited_run.py's limits: doubling
from --start, then bisecting to a multiple of --granule (128 = 2 x cp x 64 at cp 1, troupe's granule); a try that
goes over the memory limit or the time limit fails. Progress goes to stderr; the result is one line on stdout (with
--json, one JSON object). Run it with Debian's /usr/bin/python3, which has torch (the pyenv python3 on PATH has not).
"""

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import limited_run  # noqa: E402  (bench/limited_run.py)


def model_args(p):
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=512)
    p.add_argument("--num-attention-heads", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0, help="hidden and attention dropout (default 0, as troupe's runs)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default 0: all cores)")
    p.add_argument("--seed", type=int, default=1234)


def model_flags(a):
    return ["--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size), "--num-attention-heads",
            str(a.num_attention_heads), "--vocab-size", str(a.vocab_size), "--micro-batch-size",
            str(a.micro_batch_size), "--dropout", str(a.dropout), "--threads", str(a.threads), "--seed", str(a.seed)]


def describe(a):
    return (f"GPT-2 {a.num_layers} layers, hidden {a.hidden_size}, {a.num_attention_heads} heads, vocabulary "
            f"{a.vocab_size}, micro-batch {a.micro_batch_size}, fp32, AdamW")


def train_one(a):
    """Builds the model for --seq and trains one iteration; prints one line (and a JSON line with --json)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads if a.threads > 0 else (os.cpu_count() or 1))
    T, C, H, L, V, B = a.seq, a.hidden_size, a.num_attention_heads, a.num_layers, a.vocab_size, a.micro_batch_size
    if C % H:
        sys.exit("torch_long_sequence.py: --num-attention-heads must divide --hidden-size")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)
            self.drop = nn.Dropout(a.dropout)

        def attention(self, x, causal):
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, d)
            k = k.view(B, T, H, C // H).transpose(1, 2)
            v = v.view(B, T, H, C // H).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))  # (B, H, T, T)
            att = att.masked_fill(~causal, float("-inf"))
            att = self.drop(F.softmax(att, dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.attn_proj(y)

        def forward(self, x, causal):
            x = x + self.drop(self.attention(self.ln_1(x), causal))
            return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.drop = nn.Dropout(a.dropout)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))

        def forward(self, idx, targets):
            causal = torch.ones(T, T, dtype=torch.bool).tril()  # one mask, shared by the layers
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(T)))
            for block in self.blocks:
                x = block(x, causal)
            logits = self.ln_f(x) @ self.wte.weight.t()  # head tied with the token embedding
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    start = time.monotonic()
    model = GPT()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    tokens = torch.randint(0, V, (B, T + 1))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    wall = time.monotonic() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    print(f"torch_long_sequence: seq {T}: trained 1 iteration in {wall:.1f} s, loss {loss.item():.4f}, peak resident "
          f"memory {peak_mib:.0f} MiB (PyTorch {torch.__version__}, {describe(a)}, {params} parameters, "
          f"{torch.get_num_threads()} threads)", flush=True)
    if a.json:
        print(json.dumps(dict(impl="pytorch", seq=T, ok=True, seconds=round(wall, 3), loss=loss.item(),
                              peak_rss_mib=round(peak_mib, 1), parameters=params, torch_version=torch.__version__)))
    return 0


def search(a):
    scratch = a.scratch or tempfile.mkdtemp(prefix="torch_long_sequence.")
    os.makedirs(scratch, exist_ok=True)
    method = limited_run.resolve_method(a.limit_method)
    cmd = [sys.executable, os.path.abspath(__file__), "--seq", "{seq}"] + model_flags(a)
    print(f"torch_long_sequence.py: searching from {a.start} in steps of {a.granule}, limit "
          f"{limited_run.size_text(a.mem_limit)} ({method}), {a.time_limit:.0f} s per try; logs in {scratch}",
          file=sys.stderr, flush=True)

    def try_seq(seq):
        argv = [c.replace("{seq}", str(seq)) for c in cmd]
        return limited_run.run_limited(argv, a.mem_limit, a.time_limit, method, os.path.join(scratch, f"try-{seq}.out"),
                                       os.path.join(scratch, f"try-{seq}.err"))

    res = limited_run.search_longest(
        try_seq, a.start, a.granule, a.max_seq,
        log=lambda msg: print(f"torch_long_sequence.py: {msg}", file=sys.stderr, flush=True))
    best = res["longest"]
    peak = None
    if best is not None:
        with open(os.path.join(scratch, f"try-{best}.out"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if "peak resident memory" in line:
                    peak = float(line.split("peak resident memory")[1].split()[0])
    fail = res["failure"]
    why = ("no failure up to --max-seq" if res["capped"] else
           f"{res['first_failure']} failed: {fail['status']}" + (f" (exit {fail['rc']})" if fail["status"] == "failed" else ""))
    limits = f"limit {limited_run.size_text(a.mem_limit)} by {method}, {a.time_limit:.0f} s per try"
    if best is None:
        line = f"torch_long_sequence: PyTorch trains no sequence of {a.granule} or more tokens ({why}; {describe(a)}; {limits})"
    else:
        line = (f"torch_long_sequence: longest sequence PyTorch trains 1 iteration of: {'at least ' if res['capped'] else ''}"
                f"{best} tokens (peak resident memory {peak:.0f} MiB; {why}; {describe(a)}; {limits}; granule {a.granule})")
    if a.json:
        res.update(impl="pytorch", granule=a.granule, method=method, mem_limit_bytes=a.mem_limit, time_limit_s=a.time_limit,
                   peak_rss_mib=peak, scratch=scratch, line=line)
        print(json.dumps(res))
    else:
        print(line)
    return 0


def ensure_torch_interpreter(argv):
    """Re-runs this script under Debian's /usr/bin/python3 when this interpreter has no torch (the pyenv python3
    on PATH has none), so that `python3 bench/torch_long_sequence.py ...` works too."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        return
    debian = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(debian) and os.access(debian, os.X_OK):
        os.execv(debian, [debian, os.path.abspath(__file__)] + argv)
    sys.exit(f"torch_long_sequence.py: {sys.executable} cannot import torch (run it with Debian's /usr/bin/python3)")


def main(argv):
    ensure_torch_interpreter(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--seq", type=int, help="train one iteration at this sequence length")
    mode.add_argument("--longest", action="store_true", help="search the longest sequence under the limits")
    model_args(ap)
    ap.add_argument("--start", type=int, default=4096)
    ap.add_argument("--granule", type=int, default=128)
    ap.add_argument("--max-seq", type=int)
    ap.add_argument("--mem-limit", type=limited_run.parse_size, default=limited_run.parse_size("22G"))
    ap.add_argument("--time-limit", type=float, default=1800.0)
    ap.add_argument("--limit-method", choices=["auto", "systemd", "watch", "prlimit", "none"], default="auto")
    ap.add_argument("--scratch", help="directory of the tries' logs (default: a new temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    a = ap.parse_args(argv)
    if a.seq is not None:
        if a.seq < 1:
            ap.error("--seq must be >= 1")
        return train_one(a)
    return search(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
