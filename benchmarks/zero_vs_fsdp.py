"""Generated ZeRO-3 step vs PyTorch FSDP2 (`fully_shard`), and ZeRO-2 vs ZeRO-0; CPU + gloo.

    .venv/bin/python benchmarks/zero_vs_fsdp.py [--dp 2] [--steps 12] [--repeats 3]

The same GPT-2 (tied head), batch and world size on both sides, fp32, AdamW, no clipping:
- generated: the script dslc emits for `mesh { dp = N }` with `data_parallel { zero = 3 }`
  (units gathered before each block's forward and backward with prefetch, freed after,
  reduce-scattered per unit);
- FSDP2: the stock-module GPT-2 of benchmarks/common.py with `fully_shard` on every
  block (reshard_after_forward=True) and on the root, as torchtitan applies it.
A run's time is the median step after warm-up; the sides alternate --repeats times, and
each line gives each side's median over the repeats with its range (min-max) and the
median of the per-repeat ratios with theirs. Time: generated / FSDP2, target <= 1.0.
Memory: the peak resident set of each rank over the run (getrusage) less the same
process's resident set with torch imported, the largest over the ranks: what the model
state, the gathers and the activations added, on both sides measured the same way
(target: generated <= FSDP2). Then the price of sharding gradients: the generated
zero = 2 step against zero = 0 on the same plan.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from common import ENV, compared, compile_plan, reference_gpt, run, timed_steps

CONFIG = {"layers": 4, "hidden": 384, "heads": 6, "vocab": 8192, "seq_len": 256, "micro_batch": 4}
PLAN = """
cluster cpus {{ nodes = 1; gpus_per_node = {dp}; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan bench_zero {{
    model gpt2 {{
        layers = {layers}; hidden = {hidden}; heads = {heads}; vocab = {vocab}; seq_len = {seq_len}
    }}
    cluster = cpus
    mesh {{ dp = {dp} on shm }}
    data_parallel {{ zero = {zero} }}
    train {{
        steps = 100; micro_batch = {micro_batch}; global_batch = {batch}; precision = fp32
        grad_clip = 0; optimizer adamw {{ lr = 3e-4 }}; lr_schedule constant {{ warmup = 0 }}
        data = synthetic
    }}
}}
"""


def rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def generated_worker(script: str) -> None:
    """Runs a generated train.py in this process and prints its peak resident set less
    the resident set with torch imported."""
    import runpy

    import torch.distributed  # noqa: F401  (what the baseline holds on both sides)

    base = rss_bytes()
    sys.argv = [script, *sys.argv[sys.argv.index("--") + 1 :]]
    sys.path.insert(0, os.path.dirname(script))  # the program's modules, as train.py finds them
    runpy.run_path(script, run_name="__main__")
    print(f"RSS {os.environ['RANK']} {rss_bytes() - base}", flush=True)


def fsdp_worker(steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    base = rss_bytes()
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.manual_seed(0)
    model = reference_gpt(CONFIG)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh)
    times = timed_steps(model, CONFIG, steps)
    if dist.get_rank() == 0:
        print(f"MS {1000 * statistics.median(times[warmup:])}")
    print(f"RSS {dist.get_rank()} {rss_bytes() - base}", flush=True)
    dist.destroy_process_group()


def generated(script: Path, dp: int, steps: int, warmup: int) -> tuple[float, int]:
    """(median ms per step, the largest rank's added peak resident bytes)."""
    out = run(dp, __file__, "--generated-worker", str(script), "--", "--steps", str(steps), "--device", "cpu")
    times = [float(m) for m in re.findall(r"\| ([\d.]+) ms \|", out)]
    assert len(times) == steps, out
    return statistics.median(times[warmup:]), max(int(b) for b in re.findall(r"RSS \d+ (\d+)\b", out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--generated-worker", help=argparse.SUPPRESS)
    ap.add_argument("--fsdp-worker", action="store_true", help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.generated_worker:
        generated_worker(args.generated_worker)
        return
    if args.fsdp_worker:
        fsdp_worker(args.steps, args.warmup)
        return

    print(f"dp = {args.dp} processes, CPU, gloo, fp32, OMP_NUM_THREADS={ENV['OMP_NUM_THREADS']}")
    print(f"gpt2 {CONFIG}, a micro-batch of {CONFIG['micro_batch']} per rank")
    batch = CONFIG["micro_batch"] * args.dp
    with tempfile.TemporaryDirectory() as tmp:
        scripts = {z: compile_plan(PLAN.format(dp=args.dp, zero=z, batch=batch, **CONFIG), Path(tmp) / f"zero{z}")
                   for z in (0, 2, 3)}
        ms = {k: [] for k in ("zero0", "zero2", "zero3", "fsdp")}
        mib = {k: [] for k in ms}
        for _ in range(args.repeats):
            for z, script in scripts.items():
                step, rss = generated(script, args.dp, args.steps, args.warmup)
                ms[f"zero{z}"].append(step)
                mib[f"zero{z}"].append(rss / 2**20)
            out = run(args.dp, __file__, "--fsdp-worker", "--steps", str(args.steps), "--warmup", str(args.warmup))
            ms["fsdp"].append(float(re.search(r"^MS ([\d.]+)$", out, re.M).group(1)))
            mib["fsdp"].append(max(int(b) for b in re.findall(r"RSS \d+ (\d+)\b", out)) / 2**20)
    print("zero = 3 ", compared("generated", ms["zero3"], "FSDP2", ms["fsdp"], target="<= 1.0"))
    print("peak added per rank ", compared("generated", mib["zero3"], "FSDP2", mib["fsdp"], "MiB", "<= 1.0"))
    print("zero = 2 vs 0 ", compared("zero 2", ms["zero2"], "zero 0", ms["zero0"]), "(the price of sharding gradients)")


if __name__ == "__main__":
    main()
