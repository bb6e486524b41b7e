"""Generated serial script vs a plain single-process PyTorch loop of the same model.

    .venv/bin/python benchmarks/serial_vs_eager.py [--steps 20] [--repeats 5]

Both run in their own process with one intra-op thread (OMP_NUM_THREADS, 1 unless
set: less exposed to other load on a shared machine), the same GPT-2 model
(nn.Linear / nn.LayerNorm / nn.Embedding in the plain loop), the same batch and
the same work per step: forward, cross-entropy, backward, global-norm clipping,
AdamW. A run's time is the median step after a warm-up; the two programs alternate
`--repeats` times (5). Prints each one's median ms/step over the repeats with its range
(min-max) and the median of the per-repeat ratios generated / plain with theirs
(target: <= 1.05).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import ENV, compared, compile_plan, generated_step_ms, reference_gpt, run, timed_steps

CONFIG = {"layers": 4, "hidden": 256, "heads": 8, "vocab": 512, "seq_len": 256, "micro_batch": 8}
PLAN = """
cluster one {{ nodes = 1; gpus_per_node = 1; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan bench_serial {{
    model gpt2 {{
        layers = {layers}; hidden = {hidden}; heads = {heads}; vocab = {vocab}; seq_len = {seq_len}
    }}
    cluster = one
    train {{
        steps = 100; micro_batch = {micro_batch}; global_batch = {micro_batch}; precision = fp32
        optimizer adamw {{ lr = 3e-4 }}; lr_schedule constant {{ warmup = 0 }}; data = synthetic
    }}
}}
"""


def plain_loop(steps: int) -> list[float]:
    """The reference: a nanoGPT-style model and loop with stock torch modules."""
    import torch

    torch.manual_seed(0)
    return timed_steps(reference_gpt(CONFIG), CONFIG, steps, clip=1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_worker:
        print(1000 * statistics.median(plain_loop(args.steps)[args.warmup :]))
        return

    plain_flags = ["--plain-worker", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    with tempfile.TemporaryDirectory() as tmp:
        script = compile_plan(PLAN.format(**CONFIG), Path(tmp))
        gens, plains = [], []
        for _ in range(args.repeats):
            gens.append(generated_step_ms(script, 1, args.steps, args.warmup))
            plains.append(float(run(1, __file__, *plain_flags).split()[-1]))
    threads = ENV["OMP_NUM_THREADS"]
    print(f"model: gpt2 {CONFIG}, fp32, CPU, OMP_NUM_THREADS={threads}")
    print(compared("generated", gens, "plain", plains, target="<= 1.05"))


if __name__ == "__main__":
    main()
