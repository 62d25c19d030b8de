#!/usr/bin/env python3
"""Checks a file written by `troupe ckpt export --format hf` against Hugging Face GPT2LMHeadModel.

The file must hold, at its root and nowhere else, exactly the keys of GPT2LMHeadModel.state_dict() as
float32 datasets with the shapes that its config attributes (n_layer, n_embd, n_head, n_positions,
vocab_size, layer_norm_epsilon) imply, and lm_head.weight must equal transformer.wte.weight (tied).

Usage: hf_export_check.py FILE [--layers N]    exit 0: conforms; 1: it does not (reasons on stderr).
"""
import argparse
import sys

import h5py
import numpy as np

CONFIG_ATTRS = ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "layer_norm_epsilon")


def gpt2_lm_head_state_dict_shapes(n_layer, n_embd, n_positions, vocab_size):
    """GPT2LMHeadModel's state-dict keys and shapes (Conv1D weights are (in, out))."""
    c = n_embd
    shapes = {
        "transformer.wte.weight": (vocab_size, c),
        "transformer.wpe.weight": (n_positions, c),
    }
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        shapes.update({
            h + "ln_1.weight": (c,),
            h + "ln_1.bias": (c,),
            h + "attn.c_attn.weight": (c, 3 * c),
            h + "attn.c_attn.bias": (3 * c,),
            h + "attn.c_proj.weight": (c, c),
            h + "attn.c_proj.bias": (c,),
            h + "ln_2.weight": (c,),
            h + "ln_2.bias": (c,),
            h + "mlp.c_fc.weight": (c, 4 * c),
            h + "mlp.c_fc.bias": (4 * c,),
            h + "mlp.c_proj.weight": (4 * c, c),
            h + "mlp.c_proj.bias": (c,),
        })
    shapes["transformer.ln_f.weight"] = (c,)
    shapes["transformer.ln_f.bias"] = (c,)
    shapes["lm_head.weight"] = (vocab_size, c)
    return shapes


def check(path, layers):
    problems = []
    with h5py.File(path, "r") as f:
        missing_attrs = [a for a in CONFIG_ATTRS if a not in f.attrs]
        if missing_attrs:
            return [f"config attributes missing: {missing_attrs}"]
        cfg = {a: f.attrs[a] for a in CONFIG_ATTRS}
        if layers is not None and int(cfg["n_layer"]) != layers:
            problems.append(f"n_layer is {cfg['n_layer']}, expected {layers}")
        if int(cfg["n_embd"]) % int(cfg["n_head"]) != 0:
            problems.append(f"n_head {cfg['n_head']} does not divide n_embd {cfg['n_embd']}")
        if not float(cfg["layer_norm_epsilon"]) > 0:
            problems.append("layer_norm_epsilon is not positive")
        expected = gpt2_lm_head_state_dict_shapes(int(cfg["n_layer"]), int(cfg["n_embd"]),
                                                  int(cfg["n_positions"]), int(cfg["vocab_size"]))
        objects = {}
        f.visititems(lambda name, obj: objects.__setitem__(name, obj))
        groups = [n for n, o in objects.items() if isinstance(o, h5py.Group)]
        if groups:
            problems.append(f"unexpected groups: {groups}")
        keys = {n for n, o in objects.items() if isinstance(o, h5py.Dataset)}
        if keys - expected.keys():
            problems.append(f"keys not in GPT2LMHeadModel: {sorted(keys - expected.keys())}")
        if expected.keys() - keys:
            problems.append(f"GPT2LMHeadModel keys missing: {sorted(expected.keys() - keys)}")
        for key in sorted(keys & expected.keys()):
            ds = f[key]
            if ds.shape != expected[key]:
                problems.append(f"{key}: shape {ds.shape}, expected {expected[key]}")
            if ds.dtype != np.float32:
                problems.append(f"{key}: dtype {ds.dtype}, expected float32")
        if not problems and not np.array_equal(f["lm_head.weight"][()], f["transformer.wte.weight"][()]):
            problems.append("lm_head.weight differs from transformer.wte.weight (they are tied)")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--layers", type=int, default=None, help="expected number of layers")
    args = parser.parse_args()
    try:
        problems = check(args.file, args.layers)
    except (OSError, KeyError) as e:
        problems = [f"cannot read: {e}"]
    for p in problems:
        print(f"hf_export_check: {args.file}: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
