# A rank under `troupe launch --nproc-per-node N -- python3 torch_allreduce.py OUT_DIR`: joins the
# process group the way torchrun's scripts do (gloo, init_method env://, from RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT alone), all-reduces a random tensor and checks the sum against the sum
# it computes itself from every rank's tensor (each made from the seed 1000 + rank), and all-gathers
# the ranks. Writes OUT_DIR/allreduce.<RANK> with "ok" and the world it saw.
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])


def tensor_of(r):
    g = torch.Generator().manual_seed(1000 + r)
    return torch.randn(257, generator=g, dtype=torch.float64)


x = tensor_of(rank)
dist.all_reduce(x, op=dist.ReduceOp.SUM)
expected = sum(tensor_of(r) for r in range(world))
assert torch.allclose(x, expected, rtol=0, atol=1e-12), (x - expected).abs().max()
ranks = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
dist.all_gather(ranks, torch.tensor([rank], dtype=torch.int64))
assert [int(t) for t in ranks] == list(range(world))
dist.barrier()
with open(os.path.join(sys.argv[1], f"allreduce.{rank}"), "w") as f:
    f.write(f"ok {world}\n")
dist.destroy_process_group()
