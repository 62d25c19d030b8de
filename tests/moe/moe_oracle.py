#!/usr/bin/python3
"""Independent float64 oracle of one troupe MoE layer (docs/MOE_SEMANTICS.md).

    moe_oracle.py IN.h5 OUT.h5
    moe_oracle.py --compare IN.h5 TROUPE.h5 [--rtol 1e-9] [--atol 0]

IN.h5: attribute "config" (a JSON string, keys below) and float64 datasets "x" (N, C), "dy" (N, C)
and the weights ("router.weight", "experts.{e}.c_fc.weight", ...; see WEIGHT NAMES below).
Rows of x, dy and y are troupe's order n = b * T + t; the routing works on the anchors'
position-major order s = t * B + b (both anchors flatten [T, B, C] hidden states).

OUT.h5: "y" (N, C), scalars "lb_loss", "z_loss", "objective", int64 "tokens_per_expert" (E,),
"kept_per_expert" (E,), scalar "dropped", "dx" (N, C) and "grad/<weight name>" for every weight of
IN.h5 (zero where the anchor leaves a parameter out of the graph). Root attribute "capacity": the
per-expert capacity the anchor computes (-1: dropless), for information only (never compared).

The objective differentiated:  J = sum(y * dy) + aux_weight * (lb_coeff * lb_loss + z_coeff * z_loss)
  deepspeed: lb_loss = DeepSpeed's l_aux, lb_coeff = aux_loss_coeff, z_coeff = 0 (no z-loss there;
             z_loss is still reported as mean_s logsumexp(logits_s)^2);
  megatron:  lb_loss = the load-balancing loss of load_balancing (0 for "none") before its
             coefficient, lb_coeff = aux_loss_coeff, z_coeff = z_loss_coeff.
Both loss terms enter J whatever "training" says ("training" only picks the capacity factor for the
deepspeed router; Megatron-Core has a single factor). Megatron-Core itself computes the aux and z
losses only in training with grad enabled.

Config keys (defaults in CONFIG_DEFAULTS): router, topk, num_experts, drop_tokens, capacity_factor,
eval_capacity_factor, min_capacity, drop_policy, pad_to_capacity, load_balancing, pre_softmax,
aux_loss_coeff, z_loss_coeff, residual, shared_expert_ffn, activation, add_bias_linear, B, T,
training, aux_weight; two optional switches for anchor variants:
  deepspeed_proj_bias (false): deepspeed router only. false = the brief's contract (the experts'
      and the residual MLP's c_proj bias unused, Megatron-DeepSpeed before its 2023-07 merge, where
      dense_4h_to_h had skip_bias_add=True); true = Megatron-DeepSpeed at HEAD (RowParallelLinear
      adds the bias itself, so expert_e(x) includes it).
  router_bias (false): megatron router only: Megatron-Core (since 2025-09) gives the router a bias
      (E,) when add_bias_linear; true reads "router.bias".
Random parts of the anchors are off: DeepSpeed's RTS, top-2 Gumbel sampling, jitter; Megatron's
input jitter. Ties (equal logits / probabilities) are broken towards the lower index: the lower
expert index for expert choices, the earlier position-major token for capacity (see the doc).

Exit codes: 0 ok (compare: all within tolerance), 1 compare mismatch, 2 bad input, 77 torch or
h5py missing.
"""
import json
import math
import sys

try:
    import numpy as np
    import torch
    import h5py
except ImportError as exc:  # pragma: no cover
    print(f"moe_oracle: skipped, missing module: {exc}", file=sys.stderr)
    sys.exit(77)

torch.set_default_dtype(torch.float64)

CONFIG_DEFAULTS = {
    "router": "megatron",
    "topk": 2,
    "num_experts": None,
    "drop_tokens": True,
    "capacity_factor": 1.0,
    "eval_capacity_factor": 1.0,
    "min_capacity": 0,
    "drop_policy": "probs",
    "pad_to_capacity": False,
    "load_balancing": "aux_loss",
    "pre_softmax": False,
    "aux_loss_coeff": 0.0,
    "z_loss_coeff": 0.0,
    "residual": False,
    "shared_expert_ffn": 0,
    "activation": "gelu",
    "add_bias_linear": True,
    "B": None,
    "T": None,
    "training": True,
    "aux_weight": 1.0,
    "deepspeed_proj_bias": False,
    "router_bias": False,
}

# DeepSpeed's gating runs in fp32 ("everything is in fp32 in this function"): its divide-by-zero
# clamp is torch.finfo(float32).eps whatever precision the oracle computes in.
DS_DENOM_EPS = float(np.finfo(np.float32).eps)
GELU_C = math.sqrt(2.0 / math.pi)


class OracleError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# capacities


def deepspeed_capacity(num_tokens, num_experts, factor_times_k, min_capacity):
    """sharded_moe._capacity: ceil((S / E) * torch.tensor(factor * k)) evaluated as torch does it:
    the factor is a float32 tensor, so the product (and its ceiling) is float32 arithmetic; then
    raised to min_capacity."""
    f32 = torch.tensor(factor_times_k, dtype=torch.float32)
    cap = int(torch.ceil((num_tokens / num_experts) * f32).to(torch.int64).item())
    return max(cap, int(min_capacity))


def megatron_capacity(num_tokens, num_experts, topk, capacity_factor):
    """moe_utils.get_capacity(num_tokens=S * k, E, factor) in Python double, no min_capacity."""
    return math.ceil(((num_tokens * topk) / num_experts) * capacity_factor)


# ----------------------------------------------------------------------------------------------
# small helpers (decisions are taken on detached numpy values with explicit tie rules)


def first_argmax(rows):
    """Per row, the first index of the maximum (torch.argmax / numpy argmax rule)."""
    return np.argmax(rows, axis=1)


def topk_indices(rows, k):
    """Per row, the k largest entries, larger first, ties to the lower index."""
    order = np.argsort(-rows, axis=1, kind="stable")
    return order[:, :k]


def keep_first(mask_col, cap):
    """Of the True entries of a column, the first `cap` in position order."""
    keep = np.zeros_like(mask_col)
    idx = np.nonzero(mask_col)[0][:max(cap, 0)]
    keep[idx] = True
    return keep


def keep_largest(mask_col, value_col, cap):
    """Of the True entries of a column, the `cap` with the largest value (ties: earlier first)."""
    keep = np.zeros_like(mask_col)
    idx = np.nonzero(mask_col)[0]
    order = idx[np.argsort(-value_col[idx], kind="stable")]
    keep[order[:max(cap, 0)]] = True
    return keep


def gelu_tanh(h):
    return 0.5 * h * (1.0 + torch.tanh(GELU_C * (h + 0.044715 * h * h * h)))


def mlp(x, fc_w, fc_b, proj_w, proj_b, activation):
    h = x @ fc_w.t()
    if fc_b is not None:
        h = h + fc_b
    if activation == "gelu":
        a = gelu_tanh(h)
    elif activation == "swiglu":
        f = h.shape[1] // 2
        a = torch.nn.functional.silu(h[:, :f]) * h[:, f:]
    else:
        raise OracleError(f"unknown activation {activation!r}")
    out = a @ proj_w.t()
    if proj_b is not None:
        out = out + proj_b
    return out


# ----------------------------------------------------------------------------------------------
# the two routers: each returns (combine (S, E) tensor, dispatch (S, E) bool numpy: which
# (token, expert) pairs the experts compute, routed (S, E) bool, kept (S, E) bool, lb_loss, capacity)


def route_deepspeed(logits, cfg):
    S, E = logits.shape
    k = cfg["topk"]
    factor = cfg["capacity_factor"] if cfg["training"] else cfg["eval_capacity_factor"]
    drop = cfg["drop_tokens"]
    gates = torch.softmax(logits, dim=1)
    g = gates.detach().numpy()
    capacity = -1

    if k == 1:
        if S < cfg["min_capacity"]:
            raise OracleError("DeepSpeed top1gating asserts tokens >= min_capacity")
        first = first_argmax(g)
        mask1 = np.zeros((S, E), dtype=bool)
        mask1[np.arange(S), first] = True
        routed = mask1
        m1 = torch.from_numpy(mask1.astype(np.float64))
        lb = torch.sum(gates.mean(dim=0) * m1.mean(dim=0)) * E
        if drop:
            capacity = deepspeed_capacity(S, E, factor, cfg["min_capacity"])
            kept = np.stack([keep_first(mask1[:, e], capacity) for e in range(E)], axis=1)
        else:
            kept = mask1.copy()
        combine = gates * torch.from_numpy(kept.astype(np.float64))
        return combine, kept, routed, kept, lb, capacity

    if k == 2:
        first = first_argmax(g)
        mask1 = np.zeros((S, E), dtype=bool)
        mask1[np.arange(S), first] = True
        # second expert: argmax of the logits with the first masked to -inf (no Gumbel noise)
        lg = logits.detach().numpy().copy()
        lg[mask1] = -np.inf
        second = first_argmax(lg)
        mask2 = np.zeros((S, E), dtype=bool)
        mask2[np.arange(S), second] = True
        m1 = torch.from_numpy(mask1.astype(np.float64))
        lb = torch.mean(gates.mean(dim=0) * m1.mean(dim=0)) * E * E
        routed_count = mask1.astype(np.int64) + mask2.astype(np.int64)
        if drop:
            capacity = deepspeed_capacity(S, E, factor * 2, cfg["min_capacity"])
            loc1 = np.cumsum(mask1, axis=0) - 1
            loc2 = np.cumsum(mask2, axis=0) - 1 + mask1.sum(axis=0, keepdims=True)
            keep1 = mask1 & (loc1 < capacity)
            keep2 = mask2 & (loc2 < capacity)
        else:
            keep1, keep2 = mask1.copy(), mask2.copy()
        k1 = torch.from_numpy(keep1.astype(np.float64))
        k2 = torch.from_numpy(keep2.astype(np.float64))
        g1 = (gates * k1).sum(dim=1)
        g2 = (gates * k2).sum(dim=1)
        denom = torch.clamp(g1 + g2, min=DS_DENOM_EPS)
        combine = (g1 / denom)[:, None] * k1 + (g2 / denom)[:, None] * k2
        kept_count = keep1.astype(np.int64) + keep2.astype(np.int64)
        return combine, kept_count > 0, routed_count, kept_count, lb, capacity

    # k > 2: DeepSpeed's topkgating (TopKGate passes no drop_policy: always "probs")
    if k > E:
        raise OracleError("topk > num_experts")
    top = topk_indices(g, k)
    mask = np.zeros((S, E), dtype=bool)
    np.put_along_axis(mask, top, True, axis=1)
    mf = torch.from_numpy(mask.astype(np.float64))
    lb = torch.mean(gates.mean(dim=0) * mf.mean(dim=0)) * E * E / k
    if drop:
        capacity = deepspeed_capacity(S, E, factor * k, cfg["min_capacity"])
        kept = np.stack([keep_largest(mask[:, e], g[:, e], capacity) for e in range(E)], axis=1)
    else:
        kept = mask.copy()
    gm = gates * torch.from_numpy(kept.astype(np.float64))
    denom = torch.clamp(gm.sum(dim=-1, keepdim=True), min=DS_DENOM_EPS)
    combine = gm / denom
    return combine, kept, mask, kept, lb, capacity


def route_megatron(logits, cfg, B, T):
    S, E = logits.shape
    k = cfg["topk"]
    if k > E:
        raise OracleError("topk > num_experts")
    if cfg["pre_softmax"]:
        scores = torch.softmax(logits, dim=-1)
        top = topk_indices(scores.detach().numpy(), k)
        probs = torch.gather(scores, 1, torch.from_numpy(top))
    else:
        top = topk_indices(logits.detach().numpy(), k)
        probs = torch.softmax(torch.gather(logits, 1, torch.from_numpy(top)), dim=-1)
    routed = np.zeros((S, E), dtype=bool)
    np.put_along_axis(routed, top, True, axis=1)
    routing_probs = torch.zeros(S, E).scatter(1, torch.from_numpy(top), probs)
    rp = routing_probs.detach().numpy()

    capacity = -1
    dispatch = routed.copy()
    kept = routed.copy()
    if cfg["drop_tokens"]:
        capacity = megatron_capacity(S, E, k, cfg["capacity_factor"])
        if capacity > S:
            cap_mask = np.ones((S, E), dtype=bool)
        else:
            if cfg["drop_policy"] not in ("probs", "position"):
                raise OracleError(f"unknown drop_policy {cfg['drop_policy']!r}")
            cols = []
            for e in range(E):
                # The capacity set of expert e: the `capacity` largest entries of its column over all
                # S tokens (torch.topk along tokens): routed tokens first, by probability ("probs")
                # or all equal ("position"), ties to the earlier token; then unrouted tokens (value
                # 0), earliest first, which only matter as padding (pad_to_capacity).
                r_idx = np.nonzero(routed[:, e])[0]
                u_idx = np.nonzero(~routed[:, e])[0]
                if cfg["drop_policy"] == "probs":
                    r_idx = r_idx[np.argsort(-rp[r_idx, e], kind="stable")]
                order = np.concatenate([r_idx, u_idx])
                col = np.zeros(S, dtype=bool)
                col[order[:capacity]] = True
                cols.append(col)
            cap_mask = np.stack(cols, axis=1)
        kept = routed & cap_mask
        dispatch = cap_mask if cfg["pad_to_capacity"] else kept
    combine = routing_probs * torch.from_numpy(dispatch.astype(np.float64))

    # load balancing: the full softmax, the top-k map of it before any dropping
    scores = torch.softmax(logits, dim=-1)
    aux_top = topk_indices(scores.detach().numpy(), k)
    aux_map = np.zeros((S, E), dtype=bool)
    np.put_along_axis(aux_map, aux_top, True, axis=1)
    lbt = cfg["load_balancing"]
    if lbt == "aux_loss":
        counts = torch.from_numpy(aux_map.sum(axis=0).astype(np.float64))
        lb = torch.sum(scores.sum(dim=0) * counts) * (E / (k * S * S))
    elif lbt == "seq_aux_loss":
        # [T * B, E] position-major -> [T, B * E]: every (sequence b, expert e) is one column
        sc = scores.reshape(T, B * E)
        cnt = torch.from_numpy(aux_map.reshape(T, B * E).sum(axis=0).astype(np.float64))
        lb = torch.sum(sc.sum(dim=0) * cnt) * (E / (k * T * T)) / B
    elif lbt == "none":
        lb = torch.zeros(())
    else:
        raise OracleError(f"unknown load_balancing {lbt!r}")
    return combine, dispatch, routed, kept, lb, capacity


# ----------------------------------------------------------------------------------------------


def parse_config(cfg_in):
    cfg = dict(CONFIG_DEFAULTS)
    unknown = set(cfg_in) - set(CONFIG_DEFAULTS)
    if unknown:
        print(f"moe_oracle: ignoring unknown config keys {sorted(unknown)}", file=sys.stderr)
    cfg.update({k: v for k, v in cfg_in.items() if k in CONFIG_DEFAULTS})
    for key in ("topk", "min_capacity", "shared_expert_ffn"):
        cfg[key] = int(cfg[key])
    for key in ("capacity_factor", "eval_capacity_factor", "aux_loss_coeff", "z_loss_coeff", "aux_weight"):
        cfg[key] = float(cfg[key]) if cfg[key] is not None else 0.0
    for key in ("drop_tokens", "pad_to_capacity", "pre_softmax", "residual", "add_bias_linear",
                "training", "deepspeed_proj_bias", "router_bias"):
        cfg[key] = bool(cfg[key])
    if cfg["router"] not in ("deepspeed", "megatron"):
        raise OracleError(f"unknown router {cfg['router']!r}")
    if cfg["B"] is None or cfg["T"] is None:
        raise OracleError("config needs B and T")
    cfg["B"], cfg["T"] = int(cfg["B"]), int(cfg["T"])
    if cfg["topk"] < 1:
        raise OracleError("topk must be >= 1")
    if cfg["residual"] and cfg["router"] != "deepspeed":
        raise OracleError("residual (PR-MoE) belongs to the deepspeed router")
    if cfg["shared_expert_ffn"] > 0 and cfg["router"] != "megatron":
        raise OracleError("shared_expert_ffn belongs to the megatron router")
    return cfg


def weight_names(cfg, E, present):
    """The weights the layer uses, in a fixed order; `present` is the set of IN.h5 names."""
    names = ["router.weight"]
    if cfg["router"] == "megatron" and cfg["router_bias"]:
        names.append("router.bias")
    bias = cfg["add_bias_linear"]
    proj_bias = bias and (cfg["router"] == "megatron" or cfg["deepspeed_proj_bias"])
    for e in range(E):
        names.append(f"experts.{e}.c_fc.weight")
        if bias:
            names.append(f"experts.{e}.c_fc.bias")
        names.append(f"experts.{e}.c_proj.weight")
        if proj_bias:
            names.append(f"experts.{e}.c_proj.bias")
    if cfg["residual"]:
        names.append("mlp.c_fc.weight")
        if bias:
            names.append("mlp.c_fc.bias")
        names.append("mlp.c_proj.weight")
        if proj_bias:
            names.append("mlp.c_proj.bias")
        names += ["coefficient.weight", "coefficient.bias"]
    if cfg["shared_expert_ffn"] > 0:
        names.append("shared_expert.c_fc.weight")
        if bias:
            names.append("shared_expert.c_fc.bias")
        names.append("shared_expert.c_proj.weight")
        if bias:
            names.append("shared_expert.c_proj.bias")
    missing = [n for n in names if n not in present]
    if missing:
        raise OracleError(f"IN.h5 lacks weights {missing}")
    return names


def run_oracle(cfg_in, arrays, compute_grad=True):
    """cfg_in: the config dict; arrays: name -> numpy array (x, dy and the weights).
    Returns a dict name -> numpy array / python scalar (the OUT.h5 content), 'capacity', and
    private '_routed_sm' / '_kept_sm' maps (position-major) for tests. compute_grad=False skips
    the backward pass (no dx, no grad/...)."""
    cfg = parse_config(cfg_in)
    B, T = cfg["B"], cfg["T"]
    x_np = np.asarray(arrays["x"], dtype=np.float64)
    dy_np = np.asarray(arrays["dy"], dtype=np.float64)
    N, C = x_np.shape
    if N != B * T or dy_np.shape != (N, C):
        raise OracleError(f"x is {x_np.shape}, dy {dy_np.shape}, B*T = {B * T}")
    rw = np.asarray(arrays["router.weight"], dtype=np.float64)
    E = rw.shape[0]
    if cfg["num_experts"] is not None and int(cfg["num_experts"]) != E:
        raise OracleError(f"num_experts {cfg['num_experts']} but router.weight has {E} rows")
    if cfg["router"] == "deepspeed" and cfg["z_loss_coeff"] != 0:
        print("moe_oracle: note: the deepspeed router has no z-loss; z_loss_coeff ignored", file=sys.stderr)
    if cfg["router"] == "megatron" and cfg["topk"] == 1 and not cfg["pre_softmax"]:
        print("moe_oracle: note: Megatron-Core's TransformerConfig refuses topk 1 without pre_softmax "
              "(every probability would be 1); computing it anyway", file=sys.stderr)
    if cfg["router"] == "megatron" and cfg["shared_expert_ffn"] > 0 and cfg["add_bias_linear"]:
        print("moe_oracle: note: Megatron-Core's SharedExpertMLP asserts add_bias_linear == False; "
              "computing the shared expert with biases anyway", file=sys.stderr)

    names = weight_names(cfg, E, set(arrays))
    W = {n: torch.tensor(np.asarray(arrays[n], dtype=np.float64), requires_grad=True) for n in names}
    # weights present in IN.h5 that the anchor leaves out of the graph (zero gradient)
    unused = [n for n in arrays if n not in ("x", "dy") and n not in W]

    x = torch.tensor(x_np, requires_grad=True)
    dy = torch.tensor(dy_np)
    # troupe row n = b*T + t  ->  position-major s = t*B + b
    xs = x.reshape(B, T, C).transpose(0, 1).reshape(T * B, C)
    S = T * B

    logits = xs @ W["router.weight"].t()
    if "router.bias" in W:
        logits = logits + W["router.bias"]
    z_loss = torch.mean(torch.logsumexp(logits, dim=-1) ** 2)

    if cfg["router"] == "deepspeed":
        combine, dispatch, routed, kept, lb, capacity = route_deepspeed(logits, cfg)
        lb_coeff, z_coeff = cfg["aux_loss_coeff"], 0.0
    else:
        combine, dispatch, routed, kept, lb, capacity = route_megatron(logits, cfg, B, T)
        lb_coeff = 0.0 if cfg["load_balancing"] == "none" else cfg["aux_loss_coeff"]
        z_coeff = cfg["z_loss_coeff"]

    act = cfg["activation"]
    out = torch.zeros(S, C)
    for e in range(E):
        idx = np.nonzero(dispatch[:, e])[0]
        if idx.size == 0:
            continue
        it = torch.from_numpy(idx)
        oe = mlp(xs[it], W[f"experts.{e}.c_fc.weight"], W.get(f"experts.{e}.c_fc.bias"),
                 W[f"experts.{e}.c_proj.weight"], W.get(f"experts.{e}.c_proj.bias"), act)
        out = out.index_add(0, it, combine[it, e:e + 1] * oe)

    if cfg["residual"]:
        mo = mlp(xs, W["mlp.c_fc.weight"], W.get("mlp.c_fc.bias"), W["mlp.c_proj.weight"],
                 W.get("mlp.c_proj.bias"), act)
        coef = torch.softmax(xs @ W["coefficient.weight"].t() + W["coefficient.bias"], dim=-1)
        out = out * coef[:, 0:1] + mo * coef[:, 1:2]
    if cfg["shared_expert_ffn"] > 0:
        out = out + mlp(xs, W["shared_expert.c_fc.weight"], W.get("shared_expert.c_fc.bias"),
                        W["shared_expert.c_proj.weight"], W.get("shared_expert.c_proj.bias"), act)

    y = out.reshape(T, B, C).transpose(0, 1).reshape(N, C)
    objective = torch.sum(y * dy) + cfg["aux_weight"] * (lb_coeff * lb + z_coeff * z_loss)
    if compute_grad:
        objective.backward()

    res = {
        "y": y.detach().numpy().copy(),
        "lb_loss": float(lb.detach()),
        "z_loss": float(z_loss.detach()),
        "objective": float(objective.detach()),
        "tokens_per_expert": np.asarray(routed, dtype=np.int64).sum(axis=0).astype(np.int64),
        "kept_per_expert": np.asarray(kept, dtype=np.int64).sum(axis=0).astype(np.int64),
    }
    if compute_grad:
        res["dx"] = x.grad.detach().numpy().copy()
    res["dropped"] = int(res["tokens_per_expert"].sum() - res["kept_per_expert"].sum())
    if compute_grad:
        for n, t in W.items():
            g = t.grad if t.grad is not None else torch.zeros_like(t)
            res[f"grad/{n}"] = g.detach().numpy().copy()
        for n in unused:
            res[f"grad/{n}"] = np.zeros_like(np.asarray(arrays[n], dtype=np.float64))
    res["capacity"] = int(capacity)
    # position-major maps, for tests
    res["_routed_sm"] = np.asarray(routed)
    res["_kept_sm"] = np.asarray(kept)
    return res


# ----------------------------------------------------------------------------------------------
# files


def read_input(path):
    with h5py.File(path, "r") as f:
        raw = f.attrs["config"]
        if isinstance(raw, bytes):
            raw = raw.decode()
        cfg = json.loads(str(raw))
        arrays = {}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                arrays[name] = obj[()]

        f.visititems(visit)
    return cfg, arrays


def write_output(path, res):
    with h5py.File(path, "w") as f:
        for k, v in res.items():
            if k.startswith("_") or k == "capacity":
                continue
            if isinstance(v, (int, np.integer)):
                f.create_dataset(k, data=np.int64(v))
            elif isinstance(v, float):
                f.create_dataset(k, data=np.float64(v))
            else:
                f.create_dataset(k, data=v)
        f.attrs["capacity"] = res["capacity"]


def compare(res, troupe_path, rtol, atol):
    rows, ok = [], True
    with h5py.File(troupe_path, "r") as f:
        for k, ref in res.items():
            if k.startswith("_") or k == "capacity":
                continue
            if k not in f:
                rows.append((k, "absent", ""))
                if k == "y":
                    ok = False
                continue
            got = f[k][()]
            ref_a = np.asarray(ref)
            got_a = np.asarray(got)
            if got_a.shape != ref_a.shape:
                rows.append((k, "SHAPE", f"{got_a.shape} vs oracle {ref_a.shape}"))
                ok = False
                continue
            if np.issubdtype(ref_a.dtype, np.integer):
                good = np.array_equal(got_a.astype(np.int64), ref_a.astype(np.int64))
                rows.append((k, "ok" if good else "FAIL", "exact" if good else
                             f"troupe {got_a.tolist()} oracle {ref_a.tolist()}"))
                ok &= good
                continue
            err = float(np.max(np.abs(got_a.astype(np.float64) - ref_a))) if ref_a.size else 0.0
            scale = float(np.max(np.abs(ref_a))) if ref_a.size else 0.0
            rel = err / max(scale, 1e-300)
            good = bool(np.all(np.isfinite(got_a))) and (rel <= rtol or err <= atol)
            rows.append((k, "ok" if good else "FAIL", f"rel {rel:.3e}  abs {err:.3e}  max|oracle| {scale:.3e}"))
            ok &= good
    width = max(len(r[0]) for r in rows) if rows else 10
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status:<6}  {detail}")
    print("PASS" if ok else "FAIL", f"(rtol {rtol:g}, atol {atol:g})")
    return ok


def main(argv):
    args = list(argv)
    try:
        if args and args[0] == "--compare":
            rtol, atol = 1e-9, 0.0
            rest = []
            i = 1
            while i < len(args):
                if args[i] == "--rtol":
                    rtol = float(args[i + 1]); i += 2
                elif args[i] == "--atol":
                    atol = float(args[i + 1]); i += 2
                else:
                    rest.append(args[i]); i += 1
            if len(rest) != 2:
                print(__doc__, file=sys.stderr)
                return 2
            cfg, arrays = read_input(rest[0])
            res = run_oracle(cfg, arrays)
            return 0 if compare(res, rest[1], rtol, atol) else 1
        if len(args) != 2:
            print(__doc__, file=sys.stderr)
            return 2
        cfg, arrays = read_input(args[0])
        res = run_oracle(cfg, arrays)
        write_output(args[1], res)
        return 0
    except (OracleError, KeyError, OSError) as exc:
        print(f"moe_oracle: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
