"""Generated ZeRO-3 step vs PyTorch FSDP2 (`fully_shard`), and ZeRO-2 vs ZeRO-0; CPU + gloo.

    .venv/bin/python benchmarks/zero_vs_fsdp.py [--dp 2] [--steps 12] [--repeats 2]

The same GPT-2 (tied head), batch and world size on both sides, fp32, AdamW, no clipping:
- generated: the script dslc emits for `mesh { dp = N }` with `data_parallel { zero = 3 }`
  (units gathered before each block's forward and backward with prefetch, freed after,
  reduce-scattered per unit);
- FSDP2: the stock-module GPT-2 of benchmarks/common.py with `fully_shard` on every
  block (reshard_after_forward=True) and on the root, as torchtitan applies it.
A step's time is the median after warm-up, best of --repeats alternating runs; the ratio
generated / FSDP2 has the target <= 1.0. Memory: the peak resident set of each rank over
the run (getrusage) less the same process's resident set with torch imported, the largest
over the ranks: what the model state,
the gathers and the activations added, on both sides measured the same way (target:
generated <= FSDP2). Then the price of sharding gradients: the generated zero = 2 step
against zero = 0 on the same plan.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from common import ENV, compile_plan, reference_gpt, run, timed_steps

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
    ap.add_argument("--repeats", type=int, default=2)
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
        best = {k: (math.inf, 0) for k in ("zero0", "zero2", "zero3", "fsdp")}
        for _ in range(args.repeats):
            for z, script in scripts.items():
                ms, rss = generated(script, args.dp, args.steps, args.warmup)
                best[f"zero{z}"] = min(best[f"zero{z}"], (ms, rss))
            out = run(args.dp, __file__, "--fsdp-worker", "--steps", str(args.steps), "--warmup", str(args.warmup))
            ms = float(re.search(r"^MS ([\d.]+)$", out, re.M).group(1))
            rss = max(int(b) for b in re.findall(r"RSS \d+ (\d+)\b", out))
            best["fsdp"] = min(best["fsdp"], (ms, rss))
    (z3, m3), (fs, mf) = best["zero3"], best["fsdp"]
    (z2, _), (z0, _) = best["zero2"], best["zero0"]
    print(f"zero = 3  generated {z3:8.2f} ms/step | FSDP2 {fs:8.2f} ms/step | generated / FSDP2 = {z3 / fs:.3f} (target <= 1.0)")
    print(f"          peak added per rank: generated {m3 / 2**20:.1f} MiB | FSDP2 {mf / 2**20:.1f} MiB"
          f" | ratio {m3 / mf:.3f} (target <= 1.0)")
    print(f"zero = 2  {z2:8.2f} ms/step | zero = 0 {z0:8.2f} ms/step | zero 2 / zero 0 = {z2 / z0:.3f} (the price of sharding gradients)")


if __name__ == "__main__":
    main()
