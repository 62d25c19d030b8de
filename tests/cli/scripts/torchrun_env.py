# A rank under `troupe launch -- python3 torchrun_env.py OUT_DIR [FAIL_RANK]` (tests/cli/launch_torchrun.sh):
# writes its environment and argv to OUT_DIR/env.<RANK>.<TORCHELASTIC_RESTART_COUNT>.json, prints one
# line on stdout and one on stderr naming its rank, and, on the first attempt only, exits 3 when its
# RANK is FAIL_RANK (so that --max-restarts starts the ranks again), once every rank wrote its file.
import json
import os
import sys
import time

out, fail_rank = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(out, f"env.{rank}.{attempt}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv}, f)
print(f"stdout line of rank {rank} attempt {attempt}", flush=True)
print(f"stderr line of rank {rank} attempt {attempt}", file=sys.stderr, flush=True)
if int(rank) == fail_rank and attempt == "0":
    world = int(os.environ["WORLD_SIZE"])
    for _ in range(600):  # the others are stopped when this rank fails: let them write first
        if all(os.path.exists(os.path.join(out, f"env.{r}.0.json")) for r in range(world)):
            break
        time.sleep(0.1)
    time.sleep(0.2)
    sys.exit(3)
