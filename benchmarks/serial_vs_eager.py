"""Generated serial script vs a plain single-process PyTorch loop of the same model.

    .venv/bin/python benchmarks/serial_vs_eager.py [--steps 20] [--repeats 5]

Both run in their own process with one intra-op thread (OMP_NUM_THREADS, 1 unless
set: less exposed to other load on a shared machine), the same GPT-2 model
(nn.Linear / nn.LayerNorm / nn.Embedding in the plain loop), the same batch and
the same work per step: forward, cross-entropy, backward, global-norm clipping,
AdamW. The time of a step is the median over the steps after a warm-up; the run
alternates the two programs `--repeats` times (5) and keeps each one's best median,
since other processes on a shared machine only ever make a step slower.
Prints ms/step for both and the ratio generated / plain (target: <= 1.05).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    import torch.nn.functional as F
    from torch import nn

    c = CONFIG
    h, nh, T = c["hidden"], c["heads"], c["seq_len"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            B = x.size(0)
            y = self.ln_1(x)
            q, k, v = (
                m(y).view(B, T, nh, h // nh).transpose(1, 2) for m in (self.q, self.k, self.v)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(y.transpose(1, 2).reshape(B, T, h))
            return x + self.down(F.gelu(self.up(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(c["vocab"], h), nn.Embedding(T, h)
            self.blocks = nn.ModuleList(Block() for _ in range(c["layers"]))
            self.ln_f = nn.LayerNorm(h)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe.weight[:T]
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    torch.manual_seed(0)
    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95))
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(step)
        batch = torch.randint(c["vocab"], (c["micro_batch"], T + 1), generator=g)
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


def median_ms(times: list[float], warmup: int) -> float:
    return 1000 * statistics.median(times[warmup:])


ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))


def run_generated(script: Path, steps: int, warmup: int) -> float:
    out = subprocess.run(
        [sys.executable, str(script), "--steps", str(steps), "--device", "cpu"],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    times = [float(m) / 1000 for m in re.findall(r"\| ([\d.]+) ms \|", out.stdout)]
    assert len(times) == steps, out.stdout
    return median_ms(times, warmup)


def run_plain(steps: int, warmup: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--plain-worker",
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_worker:
        print(median_ms(plain_loop(args.steps), args.warmup))
        return

    sys.path.insert(0, str(ROOT))
    from dslc import codegen
    from dslc.lower import load_text

    plan = load_text(PLAN.format(**CONFIG), "bench_serial.plan").program.plans[0]
    with tempfile.TemporaryDirectory() as tmp:
        script = codegen.write(plan, Path(tmp)) / "train.py"
        gen, plain = math.inf, math.inf
        for _ in range(args.repeats):
            gen = min(gen, run_generated(script, args.steps, args.warmup))
            plain = min(plain, run_plain(args.steps, args.warmup))
    threads = ENV["OMP_NUM_THREADS"]
    print(f"model: gpt2 {CONFIG}, fp32, CPU, OMP_NUM_THREADS={threads}")
    print(f"generated serial: {gen:8.2f} ms/step")
    print(f"plain PyTorch   : {plain:8.2f} ms/step")
    print(f"ratio generated / plain = {gen / plain:.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
