#!/usr/bin/python3
"""Packs one case troupe dumped (test_model "[moe_dump]": .npy files and config.json) into the
oracle's IN.h5 and TROUPE.h5 and runs `moe_oracle.py --compare` on them.

    compare_dump.py CASE_DIR [--rtol 1e-9]

Exit codes: those of moe_oracle.py --compare (0 pass, 1 mismatch, 2 bad input, 77 no torch/h5py).
"""
import json
import os
import subprocess
import sys

try:
    import h5py
    import numpy as np
except ImportError:
    print("SKIP: numpy or h5py missing")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    case = argv[0]
    rest = argv[1:]
    with open(os.path.join(case, "config.json")) as f:
        config = json.load(f)
    files = sorted(n for n in os.listdir(case) if n.endswith(".npy"))
    load = lambda n: np.load(os.path.join(case, n))
    in_path = os.path.join(case, "IN.h5")
    out_path = os.path.join(case, "TROUPE.h5")
    with h5py.File(in_path, "w") as f:
        f.attrs["config"] = json.dumps(config)
        f["x"] = load("x.npy")
        f["dy"] = load("dy.npy")
        for n in files:
            if n.startswith("w."):
                f[n[2:-4]] = load(n)
    with h5py.File(out_path, "w") as f:
        for k in ("y", "dx", "lb_loss", "z_loss", "tokens_per_expert", "kept_per_expert"):
            f[k] = load(k + ".npy")
        f["dropped"] = np.int64(load("dropped.npy")[0])
        for n in files:
            if n.startswith("grad."):
                f["grad/" + n[5:-4]] = load(n)
    print(f"== {os.path.basename(case.rstrip('/'))}")
    return subprocess.call([sys.executable, os.path.join(HERE, "moe_oracle.py"), "--compare", in_path, out_path] + rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
