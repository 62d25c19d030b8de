#!/usr/bin/python3
"""Self-checks of tests/moe/moe_oracle.py (fixed seeds, a few seconds). Exit 0 all pass, 1 a failure,
77 torch/h5py/numpy missing.

  1. autograd vs central finite differences (float64) of the objective, for small random configs of
     both routers (capacities small enough that tokens drop), every input tensor sampled;
  2. pad_to_capacity changes nothing (megatron, both drop policies);
  3. drop_tokens=False drops nothing and equals a capacity too large to drop (both routers);
  4. hand-computed tiny cases (4 tokens, B = T = 2, 2 or 3 experts, router weight = identity so the
     logits are the inputs): which tokens an over-full expert keeps (position-major order, not
     troupe's row order), the combine weights (DeepSpeed top-2 renormalisation over the kept
     choices, Megatron's unrenormalised probabilities), the losses;
  5. the capacity formulas (DeepSpeed's float32 product, Megatron's double), the loss formulas on
     random data against explicit loops, and the file/--compare round trip.
"""
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import h5py
    import moe_oracle as mo
except SystemExit as exc:  # moe_oracle exits 77 when torch or h5py is missing
    sys.exit(exc.code)
except ImportError as exc:  # pragma: no cover
    print(f"skipped: {exc}")
    sys.exit(77)

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL  {what}")
    return cond


def close(a, b, tol):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and float(np.max(np.abs(a - b), initial=0.0)) <= tol * max(1.0, float(np.max(np.abs(b), initial=0.0)))


# ---------------------------------------------------------------------------------------------
# builders


def make_arrays(cfg, C, F, rng, scale=1.0):
    B, T, E = cfg["B"], cfg["T"], cfg["num_experts"]
    N = B * T
    a = {"x": rng.normal(size=(N, C)), "dy": rng.normal(size=(N, C)),
         "router.weight": rng.normal(size=(E, C)) * scale}
    if cfg.get("router_bias"):
        a["router.bias"] = rng.normal(size=E) * 0.5
    bias = cfg.get("add_bias_linear", True)
    fc_rows = 2 * F if cfg.get("activation", "gelu") == "swiglu" else F
    ds_proj = cfg["router"] == "megatron" or cfg.get("deepspeed_proj_bias", False)

    def add_mlp(prefix, proj_bias):
        a[f"{prefix}.c_fc.weight"] = rng.normal(size=(fc_rows, C)) * 0.5
        if bias:
            a[f"{prefix}.c_fc.bias"] = rng.normal(size=fc_rows) * 0.3
        a[f"{prefix}.c_proj.weight"] = rng.normal(size=(C, F)) * 0.5
        if bias and proj_bias:
            a[f"{prefix}.c_proj.bias"] = rng.normal(size=C) * 0.3

    for e in range(E):
        add_mlp(f"experts.{e}", ds_proj)
    if cfg.get("residual"):
        add_mlp("mlp", ds_proj)
        a["coefficient.weight"] = rng.normal(size=(2, C)) * 0.5
        a["coefficient.bias"] = rng.normal(size=2) * 0.3
    if cfg.get("shared_expert_ffn", 0) > 0:
        Fs = cfg["shared_expert_ffn"]
        rows = 2 * Fs if cfg.get("activation", "gelu") == "swiglu" else Fs
        a["shared_expert.c_fc.weight"] = rng.normal(size=(rows, C)) * 0.5
        if bias:
            a["shared_expert.c_fc.bias"] = rng.normal(size=rows) * 0.3
        a["shared_expert.c_proj.weight"] = rng.normal(size=(C, Fs)) * 0.5
        if bias:
            a["shared_expert.c_proj.bias"] = rng.normal(size=C) * 0.3
    return a


def gelu_np(h):
    return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))


def expert_np(a, prefix, x, proj_bias=True):
    h = a[f"{prefix}.c_fc.weight"] @ x
    if f"{prefix}.c_fc.bias" in a:
        h = h + a[f"{prefix}.c_fc.bias"]
    o = a[f"{prefix}.c_proj.weight"] @ gelu_np(h)
    if proj_bias and f"{prefix}.c_proj.bias" in a:
        o = o + a[f"{prefix}.c_proj.bias"]
    return o


def softmax_np(v):
    v = np.asarray(v, dtype=np.float64)
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def troupe_rows(rows_sm, B, T):
    """Position-major rows (s = t*B + b) -> troupe rows (n = b*T + t)."""
    rows_sm = np.asarray(rows_sm, dtype=np.float64)
    out = np.empty_like(rows_sm)
    for t in range(T):
        for b in range(B):
            out[b * T + t] = rows_sm[t * B + b]
    return out


# ---------------------------------------------------------------------------------------------
# 1. finite differences

FD_CONFIGS = [
    dict(router="deepspeed", topk=1, num_experts=4, B=2, T=5, capacity_factor=0.75, min_capacity=0,
         aux_loss_coeff=0.3, residual=True, activation="gelu", add_bias_linear=True),
    dict(router="deepspeed", topk=2, num_experts=4, B=3, T=4, capacity_factor=0.5, min_capacity=0,
         aux_loss_coeff=0.2, activation="swiglu", add_bias_linear=False),
    dict(router="deepspeed", topk=2, num_experts=3, B=2, T=4, capacity_factor=0.6, min_capacity=1,
         aux_loss_coeff=0.1, residual=True, activation="gelu", add_bias_linear=True,
         deepspeed_proj_bias=True, training=False, eval_capacity_factor=0.4),
    dict(router="deepspeed", topk=3, num_experts=5, B=2, T=4, capacity_factor=0.5, min_capacity=0,
         aux_loss_coeff=0.2, activation="gelu", add_bias_linear=True),
    dict(router="megatron", topk=2, num_experts=4, B=2, T=5, capacity_factor=0.5, drop_policy="probs",
         load_balancing="aux_loss", aux_loss_coeff=0.3, z_loss_coeff=0.05, activation="gelu",
         add_bias_linear=True),
    dict(router="megatron", topk=3, num_experts=5, B=3, T=4, capacity_factor=0.6, drop_policy="position",
         load_balancing="seq_aux_loss", aux_loss_coeff=0.4, z_loss_coeff=0.02, pre_softmax=True,
         activation="swiglu", add_bias_linear=False),
    dict(router="megatron", topk=2, num_experts=4, B=2, T=4, drop_tokens=False,
         load_balancing="aux_loss", aux_loss_coeff=0.2, z_loss_coeff=0.01, shared_expert_ffn=5,
         activation="swiglu", add_bias_linear=False, aux_weight=2.5),
    dict(router="megatron", topk=1, num_experts=3, B=2, T=5, capacity_factor=0.7, drop_policy="probs",
         pre_softmax=True, load_balancing="seq_aux_loss", aux_loss_coeff=0.5, z_loss_coeff=0.1,
         activation="gelu", add_bias_linear=True, router_bias=True),
]


def fd_check(cfg, seed, C=4, F=3, per_tensor=6, h=1e-6):
    rng = np.random.default_rng(seed)
    arrays = make_arrays(cfg, C, F, rng)
    base = mo.run_oracle(cfg, arrays)
    check(base["dropped"] > 0 or not cfg.get("drop_tokens", True),
          f"FD config {seed}: capacity drops some tokens")
    names = ["x"] + [n for n in arrays if n not in ("x", "dy")]
    worst, checked, skipped = 0.0, 0, 0
    for n in names:
        grad = base["dx"] if n == "x" else base[f"grad/{n}"]
        flat = arrays[n].reshape(-1)
        picks = rng.choice(flat.size, size=min(per_tensor, flat.size), replace=False)
        for i in picks:
            vals = []
            same = True
            for sign in (1.0, -1.0):
                pert = dict(arrays)
                p = flat.copy()
                p[i] += sign * h
                pert[n] = p.reshape(arrays[n].shape)
                r = mo.run_oracle(cfg, pert, compute_grad=False)
                same &= np.array_equal(r["_kept_sm"], base["_kept_sm"]) and \
                    np.array_equal(r["_routed_sm"], base["_routed_sm"])
                vals.append(r["objective"])
            if not same:
                skipped += 1
                continue
            fd = (vals[0] - vals[1]) / (2 * h)
            ad = grad.reshape(-1)[i]
            err = abs(fd - ad) / max(1.0, abs(ad))
            worst = max(worst, err)
            checked += 1
    check(checked >= 0.9 * (checked + skipped) and checked > 20,
          f"FD config {seed}: enough entries checked ({checked}, {skipped} skipped)")
    check(worst < 1e-6, f"FD config {seed} ({cfg['router']} k={cfg['topk']}): worst rel err {worst:.2e}")
    return worst, checked


# ---------------------------------------------------------------------------------------------


def test_fd():
    for i, cfg in enumerate(FD_CONFIGS):
        worst, n = fd_check(cfg, seed=100 + i)
        print(f"  FD {i}: {cfg['router']:9s} k={cfg['topk']} checked {n:3d} entries, worst rel err {worst:.1e}")


def test_pad_to_capacity():
    for policy in ("probs", "position"):
        for k, cf in ((2, 0.5), (1, 0.6), (3, 2.0)):
            cfg = dict(router="megatron", topk=k, num_experts=4, B=2, T=6, capacity_factor=cf,
                       drop_policy=policy, pre_softmax=(k == 1), aux_loss_coeff=0.1, z_loss_coeff=0.01)
            arrays = make_arrays(cfg, 4, 3, np.random.default_rng(7 + k))
            a = mo.run_oracle(cfg, arrays)
            b = mo.run_oracle(dict(cfg, pad_to_capacity=True), arrays)
            same = all(close(a[key], b[key], 1e-13) for key in a
                       if not key.startswith("_") and key != "capacity")
            check(same, f"pad_to_capacity changes nothing ({policy}, k={k}, cf={cf})")


def test_dropless():
    for router, k in (("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3), ("megatron", 2), ("megatron", 3)):
        cfg = dict(router=router, topk=k, num_experts=3, B=3, T=4, drop_tokens=False,
                   capacity_factor=0.1, min_capacity=0, aux_loss_coeff=0.1)
        arrays = make_arrays(cfg, 4, 3, np.random.default_rng(11 + k))
        a = mo.run_oracle(cfg, arrays)
        check(a["dropped"] == 0 and np.array_equal(a["kept_per_expert"], a["tokens_per_expert"]),
              f"drop_tokens=False drops nothing ({router} k={k})")
        check(int(a["tokens_per_expert"].sum()) == 12 * k, f"{router} k={k}: S*k assignments routed")
        big = mo.run_oracle(dict(cfg, drop_tokens=True, capacity_factor=100.0), arrays)
        check(close(a["y"], big["y"], 1e-14) and close(a["dx"], big["dx"], 1e-14),
              f"dropless equals a capacity too large to drop ({router} k={k})")


def hand_arrays(logits_sm, E, B=2, T=2, seed=5):
    """Router = identity (C = E): the logits are the inputs, given position-major."""
    rng = np.random.default_rng(seed)
    C, F = E, 3
    a = {"x": troupe_rows(logits_sm, B, T), "dy": rng.normal(size=(B * T, C)), "router.weight": np.eye(E)}
    for e in range(E):
        a[f"experts.{e}.c_fc.weight"] = rng.normal(size=(F, C))
        a[f"experts.{e}.c_fc.bias"] = rng.normal(size=F)
        a[f"experts.{e}.c_proj.weight"] = rng.normal(size=(C, F))
        a[f"experts.{e}.c_proj.bias"] = rng.normal(size=C)
    return a


def test_hand_deepspeed_top1():
    # 4 tokens, position-major s = t*B + b; troupe rows: s0 -> n0, s1 -> n2, s2 -> n1, s3 -> n3.
    lg = np.array([[2.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.5, 0.0]])  # everyone's first choice: e0
    a = hand_arrays(lg, 2)
    cfg = dict(router="deepspeed", topk=1, num_experts=2, B=2, T=2, capacity_factor=1.0, min_capacity=0,
               add_bias_linear=True)
    r = mo.run_oracle(cfg, a)
    p = softmax_np(lg)
    x = a["x"]
    # capacity ceil(4/2 * 1) = 2: e0 keeps s0, s1 = troupe rows 0 and 2 (not rows 0 and 1)
    exp = np.zeros((4, 2))
    exp[0] = p[0, 0] * expert_np(a, "experts.0", x[0], proj_bias=False)
    exp[2] = p[1, 0] * expert_np(a, "experts.0", x[2], proj_bias=False)
    check(r["capacity"] == 2, "ds top1: capacity 2")
    check(close(r["y"], exp, 1e-14), "ds top1: e0 keeps the two earliest positions (rows 0, 2)")
    check(list(r["tokens_per_expert"]) == [4, 0] and list(r["kept_per_expert"]) == [2, 0]
          and r["dropped"] == 2, "ds top1: counts")
    check(abs(r["lb_loss"] - 2 * p[:, 0].mean()) < 1e-15, "ds top1: l_aux = E sum_e me ce")
    # min_capacity 3 raises the capacity: s2 (row 1) is kept too, s3 (row 3) still dropped
    r3 = mo.run_oracle(dict(cfg, min_capacity=3), a)
    exp[1] = p[2, 0] * expert_np(a, "experts.0", x[1], proj_bias=False)
    check(r3["capacity"] == 3 and close(r3["y"], exp, 1e-14), "ds top1: min_capacity 3 keeps s0, s1, s2")
    # deepspeed_proj_bias: the bias enters, scaled by the combine weight
    rb = mo.run_oracle(dict(cfg, deepspeed_proj_bias=True), a)
    exp_b = np.zeros((4, 2))
    exp_b[0] = p[0, 0] * expert_np(a, "experts.0", x[0])
    exp_b[2] = p[1, 0] * expert_np(a, "experts.0", x[2])
    check(close(rb["y"], exp_b, 1e-14), "ds top1: deepspeed_proj_bias adds w * c_proj.bias")
    check(np.all(r["grad/experts.0.c_proj.bias"] == 0), "ds top1: unused c_proj.bias has zero gradient")


def test_hand_deepspeed_top2():
    # first choices: s0, s1, s2 -> e0, s3 -> e1; with E = 2 the second choice is the other expert.
    lg = np.array([[2.0, 0.0], [1.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    a = hand_arrays(lg, 2)
    cfg = dict(router="deepspeed", topk=2, num_experts=2, B=2, T=2, capacity_factor=0.5, min_capacity=0)
    r = mo.run_oracle(cfg, a)
    p = softmax_np(lg)
    x = a["x"]
    E0 = lambda n: expert_np(a, "experts.0", x[n], proj_bias=False)
    E1 = lambda n: expert_np(a, "experts.1", x[n], proj_bias=False)
    # capacity ceil(4/2 * (0.5*2)) = 2. e0: first choices s0, s1 kept, s2 dropped (location 2); the
    # second choice s3 sits at location 3 (after all 3 first choices): dropped. e1: first choice s3 at
    # 0, second choices s0, s1, s2 at 1, 2, 3: only s0 kept.
    # s0 (row 0): both kept, weights p/(p0+p1) = p; s1 (row 2): only e0 -> weight 1;
    # s2 (row 1): nothing; s3 (row 3): only e1 -> weight 1.
    exp = np.zeros((4, 2))
    exp[0] = p[0, 0] * E0(0) + p[0, 1] * E1(0)
    exp[2] = 1.0 * E0(2)
    exp[3] = 1.0 * E1(3)
    check(r["capacity"] == 2, "ds top2: capacity 2")
    check(close(r["y"], exp, 1e-14), "ds top2: drop order (first choices ahead of seconds), renormalised weights")
    check(list(r["tokens_per_expert"]) == [4, 4] and list(r["kept_per_expert"]) == [2, 2]
          and r["dropped"] == 4, "ds top2: counts")
    me = p.mean(axis=0)
    ce = np.array([0.75, 0.25])
    check(abs(r["lb_loss"] - 2 * np.sum(me * ce)) < 1e-15, "ds top2: l_aux uses first choices only")


def test_hand_megatron_top1():
    lg = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0]])  # all -> e0, probability rising
    a = hand_arrays(lg, 2)
    p = softmax_np(lg)
    x = a["x"]
    E0 = lambda n: expert_np(a, "experts.0", x[n])
    cfg = dict(router="megatron", topk=1, num_experts=2, B=2, T=2, capacity_factor=1.0, pre_softmax=True,
               aux_loss_coeff=0.1, z_loss_coeff=0.1)
    rp = mo.run_oracle(dict(cfg, drop_policy="probs"), a)
    rq = mo.run_oracle(dict(cfg, drop_policy="position"), a)
    # capacity ceil(4*1/2 * 1) = 2. probs: the two largest p: s2, s3 = rows 1, 3; position: s0, s1 = rows 0, 2
    ep = np.zeros((4, 2)); ep[1] = p[2, 0] * E0(1); ep[3] = p[3, 0] * E0(3)
    eq = np.zeros((4, 2)); eq[0] = p[0, 0] * E0(0); eq[2] = p[1, 0] * E0(2)
    check(rp["capacity"] == 2 and close(rp["y"], ep, 1e-14), "mc top1 probs: keeps the most probable (rows 1, 3)")
    check(close(rq["y"], eq, 1e-14), "mc top1 position: keeps the earliest positions (rows 0, 2)")
    check(list(rp["tokens_per_expert"]) == [4, 0] and list(rp["kept_per_expert"]) == [2, 0], "mc top1: counts")
    # aux: E/(k S^2) * sum_e (sum_s p_se) * count_e, counts before dropping
    check(abs(rp["lb_loss"] - 2.0 / 16.0 * p[:, 0].sum() * 4) < 1e-15, "mc top1: aux_loss normalisation")
    lse = np.log(np.exp(lg).sum(axis=1))
    check(abs(rp["z_loss"] - np.mean(lse ** 2)) < 1e-14, "mc: z_loss = mean logsumexp^2")
    check(abs(rp["objective"] - (np.sum(rp["y"] * a["dy"]) + 0.1 * rp["lb_loss"] + 0.1 * rp["z_loss"])) < 1e-13,
          "mc: objective = sum(y dy) + coeff lb + z_coeff z")


def test_hand_megatron_top2_no_renormalisation():
    lg = np.array([[3.0, 2.0, 0.0], [3.0, 0.0, 2.0], [3.0, 2.0, 0.0], [0.0, 3.0, 2.0]])
    a = hand_arrays(lg, 3)
    x = a["x"]
    E = lambda e, n: expert_np(a, f"experts.{e}", x[n])
    cfg = dict(router="megatron", topk=2, num_experts=3, B=2, T=2, capacity_factor=0.75,
               drop_policy="position")
    r = mo.run_oracle(cfg, a)
    q = softmax_np([3.0, 2.0])  # softmax over the two selected logits
    # capacity ceil(4*2/3 * 0.75) = 2. e0 routed s0, s1, s2 -> keeps s0, s1; e1 routed s0, s2, s3 -> keeps
    # s0, s2; e2 routed s1, s3 -> keeps both. s2 (row 1) loses e0 and keeps only q[1] on e1, s3 (row 3)
    # loses e1 (its first choice) and keeps only q[1] on e2: no renormalisation (DeepSpeed would give 1).
    exp = np.zeros((4, 3))
    exp[0] = q[0] * E(0, 0) + q[1] * E(1, 0)  # s0
    exp[2] = q[0] * E(0, 2) + q[1] * E(2, 2)  # s1
    exp[1] = q[1] * E(1, 1)                    # s2
    exp[3] = q[1] * E(2, 3)                    # s3
    check(r["capacity"] == 2 and close(r["y"], exp, 1e-14), "mc top2 position: drops s2 from e0 and s3 from e1, no renormalisation")
    # probs policy: e1 ranks s3 (q[0]) ahead of s0, s2 (q[1], tie -> earlier s0): keeps s3, s0; s2 loses e1 too
    rp = mo.run_oracle(dict(cfg, drop_policy="probs"), a)
    exp_p = np.zeros((4, 3))
    exp_p[0] = q[0] * E(0, 0) + q[1] * E(1, 0)
    exp_p[2] = q[0] * E(0, 2) + q[1] * E(2, 2)
    exp_p[3] = q[0] * E(1, 3) + q[1] * E(2, 3)
    check(close(rp["y"], exp_p, 1e-14) and rp["dropped"] == 2,
          "mc top2 probs: ranks by the combine probability, equal probabilities -> earlier token")
    check(list(r["tokens_per_expert"]) == [3, 3, 2] and list(r["kept_per_expert"]) == [2, 2, 2]
          and r["dropped"] == 2, "mc top2: counts")


def test_loss_formulas_random():
    rng = np.random.default_rng(21)
    B, T, E, k, C = 3, 5, 4, 2, 4
    for lbt in ("aux_loss", "seq_aux_loss"):
        cfg = dict(router="megatron", topk=k, num_experts=E, B=B, T=T, capacity_factor=0.5,
                   load_balancing=lbt, aux_loss_coeff=1.0)
        a = make_arrays(cfg, C, 3, rng)
        r = mo.run_oracle(cfg, a)
        # explicit loops over troupe rows: sequence b holds rows b*T .. b*T + T - 1
        logits = a["x"] @ a["router.weight"].T
        p = softmax_np(logits)
        top = np.argsort(-p, axis=1, kind="stable")[:, :k]
        m = np.zeros_like(p)
        for n in range(B * T):
            m[n, top[n]] = 1
        if lbt == "aux_loss":
            S = B * T
            f = m.sum(axis=0) / (S * k)
            P = p.mean(axis=0)
            want = E * np.sum(f * P)
        else:
            per = []
            for b in range(B):
                rows = slice(b * T, (b + 1) * T)
                f = m[rows].sum(axis=0) / (T * k)
                P = p[rows].mean(axis=0)
                per.append(E * np.sum(f * P))
            want = np.mean(per)
        check(abs(r["lb_loss"] - want) < 1e-14, f"mc {lbt}: explicit per-sequence formula ({r['lb_loss']} vs {want})")
    # DeepSpeed top-2 l_aux on random data: E * sum_e mean_s p_se * mean_s [first choice of s is e]
    cfg = dict(router="deepspeed", topk=2, num_experts=E, B=B, T=T, capacity_factor=0.5)
    a = make_arrays(cfg, C, 3, rng)
    r = mo.run_oracle(cfg, a)
    p = softmax_np(a["x"] @ a["router.weight"].T)
    first = np.argmax(p, axis=1)
    ce = np.bincount(first, minlength=E) / (B * T)
    check(abs(r["lb_loss"] - E * np.sum(p.mean(axis=0) * ce)) < 1e-14, "ds top2 l_aux on random data")


def test_capacity_formulas():
    # DeepSpeed multiplies by a float32 tensor: ceil(fp32(50/1) * fp32(0.3)) = ceil(15.000001) = 16
    check(mo.deepspeed_capacity(50, 1, 0.3, 0) == 16, "ds capacity is float32 arithmetic (50, 1, 0.3 -> 16)")
    check(mo.megatron_capacity(50, 1, 1, 0.3) == 15, "mc capacity is double arithmetic (50, 1, 0.3 -> 15)")
    check(mo.deepspeed_capacity(10, 4, 2 * 1.0, 4) == 5, "ds capacity ceil(10/4 * 2) = 5")
    check(mo.deepspeed_capacity(10, 4, 1.0, 4) == 4, "ds capacity raised to min_capacity")
    check(mo.megatron_capacity(10, 4, 2, 1.0) == 5, "mc capacity ceil(10*2/4 * 1) = 5")


def test_files_and_compare():
    cfg = dict(FD_CONFIGS[4])
    a = make_arrays(cfg, 4, 3, np.random.default_rng(3))
    import json
    with tempfile.TemporaryDirectory() as d:
        pin, pout = os.path.join(d, "in.h5"), os.path.join(d, "out.h5")
        with h5py.File(pin, "w") as f:
            f.attrs["config"] = json.dumps(cfg)
            for k, v in a.items():
                f.create_dataset(k, data=v)
        check(mo.main([pin, pout]) == 0, "oracle writes OUT.h5")
        with h5py.File(pout, "r") as f:
            names = set()
            f.visititems(lambda n, o: names.add(n) if isinstance(o, h5py.Dataset) else None)
        want = {"y", "lb_loss", "z_loss", "objective", "tokens_per_expert", "kept_per_expert", "dropped", "dx"}
        want |= {f"grad/{k}" for k in a if k not in ("x", "dy")}
        check(want <= names, f"OUT.h5 datasets: missing {sorted(want - names)}")
        check(mo.main(["--compare", pin, pout]) == 0, "--compare of the oracle against itself passes")
        with h5py.File(pout, "a") as f:
            y = f["y"][()]
            f["y"][...] = y * (1 + 1e-7)
        check(mo.main(["--compare", pin, pout]) == 1, "--compare catches a 1e-7 relative error in y")
        check(mo.main(["--compare", pin, pout, "--rtol", "1e-6"]) == 0, "--rtol loosens the comparison")
        with h5py.File(pout, "a") as f:
            f["y"][...] = y
            f["kept_per_expert"][...] = f["kept_per_expert"][()] + np.eye(1, cfg["num_experts"], 0, dtype=np.int64)[0]
        check(mo.main(["--compare", pin, pout]) == 1, "--compare: integer datasets must match exactly")


def main():
    import contextlib
    import io
    tests = [test_capacity_formulas, test_hand_deepspeed_top1, test_hand_deepspeed_top2, test_hand_megatron_top1,
             test_hand_megatron_top2_no_renormalisation, test_loss_formulas_random, test_pad_to_capacity,
             test_dropless, test_fd, test_files_and_compare]
    for t in tests:
        before = len(FAILURES)
        if t is test_files_and_compare:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                t()
        else:
            t()
        print(f"{'ok  ' if len(FAILURES) == before else 'FAIL'}  {t.__name__}")
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("all MoE oracle self-checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
