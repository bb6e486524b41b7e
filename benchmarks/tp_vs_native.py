"""Generated tensor-parallel step vs PyTorch's native tensor parallel, CPU + gloo.

    .venv/bin/python benchmarks/tp_vs_native.py [--tp 2] [--steps 20] [--repeats 3]

For a small model (where framework overhead matters) and a larger one (closer to
compute-bound), both run under torchrun with the same world size, model, batch
and work per step (forward, cross-entropy, backward, AdamW):
- generated: the script dslc emits for a `mesh { tp = N }` plan (Megatron
  column/row-parallel linears written out, vocab-parallel embedding and loss);
- native: the same GPT-2 built from nn.Linear and parallelized with
  torch.distributed.tensor.parallel (ColwiseParallel for q, k, v and the MLP's
  up projection, RowwiseParallel for the output and down projections), the
  embedding and head replicated, as in the DTensor tutorials.
A run's time is the median step after warm-up; the two sides alternate --repeats times.
Prints, per size, each side's median ms/step over the repeats with its range (min-max)
and the median of the per-repeat ratios generated / native with theirs (targets:
<= 0.9 small, <= 1.0 large).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from common import ENV, compared, compile_plan, generated_step_ms, reference_gpt, run, timed_steps

SIZES = {
    "small": {
        "layers": 2,
        "hidden": 128,
        "heads": 4,
        "vocab": 512,
        "seq_len": 128,
        "micro_batch": 4,
    },
    "large": {
        "layers": 4,
        "hidden": 512,
        "heads": 8,
        "vocab": 512,
        "seq_len": 256,
        "micro_batch": 8,
    },
}
PLAN = """
cluster cpus {{ nodes = 1; gpus_per_node = {tp}; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan bench_tp {{
    model gpt2 {{
        layers = {layers}; hidden = {hidden}; heads = {heads}; vocab = {vocab}; seq_len = {seq_len}
    }}
    cluster = cpus
    mesh {{ tp = {tp} on shm }}
    train {{
        steps = 100; micro_batch = {micro_batch}; global_batch = {micro_batch}; precision = fp32
        grad_clip = 0; optimizer adamw {{ lr = 3e-4 }}; lr_schedule constant {{ warmup = 0 }}
        data = synthetic
    }}
}}
"""


def native_worker(size: str, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    c = SIZES[size]
    tp = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (tp,))
    torch.manual_seed(0)
    model = reference_gpt(c, tp)
    plan = {n: ColwiseParallel() for n in ("q", "k", "v", "up")}
    plan.update(o=RowwiseParallel(), down=RowwiseParallel())
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    times = timed_steps(model, c, steps)
    if dist.get_rank() == 0:
        print(1000 * statistics.median(times[warmup:]))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--native-worker", choices=sorted(SIZES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.native_worker:
        native_worker(args.native_worker, args.steps, args.warmup)
        return

    print(f"tp = {args.tp} processes, CPU, gloo, fp32, OMP_NUM_THREADS={ENV['OMP_NUM_THREADS']}")
    with tempfile.TemporaryDirectory() as tmp:
        for size, config in SIZES.items():
            script = compile_plan(PLAN.format(tp=args.tp, **config), Path(tmp) / size)
            flags = ["--native-worker", size, "--steps", str(args.steps)]
            flags += ["--warmup", str(args.warmup)]
            gens, natives = [], []
            for _ in range(args.repeats):
                gens.append(generated_step_ms(script, args.tp, args.steps, args.warmup))
                natives.append(float(run(args.tp, __file__, *flags).split()[-1]))
            target = 0.9 if size == "small" else 1.0
            print(f"{size:5s} gpt2 {config}")
            print("     ", compared("generated", gens, "native", natives, target=f"<= {target}"))


if __name__ == "__main__":
    main()
