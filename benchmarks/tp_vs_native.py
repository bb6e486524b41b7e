"""Generated tensor-parallel step vs PyTorch's native tensor parallel, CPU + gloo.

    .venv/bin/python benchmarks/tp_vs_native.py [--tp 2] [--steps 20] [--repeats 2]

For a small model (where framework overhead matters) and a larger one (closer to
compute-bound), both run under torchrun with the same world size, model, batch
and work per step (forward, cross-entropy, backward, AdamW):
- generated: the script dslc emits for a `mesh { tp = N }` plan (Megatron
  column/row-parallel linears written out, vocab-parallel embedding and loss);
- native: the same GPT-2 built from nn.Linear and parallelized with
  torch.distributed.tensor.parallel (ColwiseParallel for q, k, v and the MLP's
  up projection, RowwiseParallel for the output and down projections), the
  embedding and head replicated, as in the DTensor tutorials.
A step's time is the median after warm-up, best of --repeats alternating runs.
Prints ms/step and the ratio generated / native (targets: <= 0.9 small, <= 1.0 large).
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
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    c = SIZES[size]
    h, nh, T = c["hidden"], c["heads"], c["seq_len"]
    tp = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (tp,))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
            self.n_head = nh // tp  # heads on this rank once q, k, v are column-parallel

        def forward(self, x):
            B = x.size(0)
            y = self.ln_1(x)
            q, k, v = (
                m(y).view(B, T, self.n_head, h // nh).transpose(1, 2)
                for m in (self.q, self.k, self.v)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
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
    plan = {n: ColwiseParallel() for n in ("q", "k", "v", "up")}
    plan.update(o=RowwiseParallel(), down=RowwiseParallel())
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
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
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(1000 * statistics.median(times[warmup:]))
    dist.destroy_process_group()


def torchrun(tp: int, *args: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={tp}",
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout


def run_generated(script: Path, tp: int, steps: int, warmup: int) -> float:
    out = torchrun(tp, str(script), "--steps", str(steps), "--device", "cpu")
    times = [float(m) for m in re.findall(r"\| ([\d.]+) ms \|", out)]
    assert len(times) == steps, out
    return statistics.median(times[warmup:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--native-worker", choices=sorted(SIZES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.native_worker:
        native_worker(args.native_worker, args.steps, args.warmup)
        return

    sys.path.insert(0, str(ROOT))
    from dslc import codegen
    from dslc.lower import load_text

    threads = os.environ.get("OMP_NUM_THREADS", "1")
    print(f"tp = {args.tp} processes, CPU, gloo, fp32, OMP_NUM_THREADS={threads}")
    with tempfile.TemporaryDirectory() as tmp:
        for size, config in SIZES.items():
            plan = load_text(PLAN.format(tp=args.tp, **config), "bench_tp.plan").program.plans[0]
            script = codegen.write(plan, Path(tmp) / size) / "train.py"
            gen = native = math.inf
            for _ in range(args.repeats):
                gen = min(gen, run_generated(script, args.tp, args.steps, args.warmup))
                flags = [
                    "--native-worker",
                    size,
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                ]
                native = min(native, float(torchrun(args.tp, __file__, *flags).split()[-1]))
            target = 0.9 if size == "small" else 1.0
            print(f"{size:5s} gpt2 {config}")
            print(
                f"      generated {gen:8.2f} ms/step | native {native:8.2f} ms/step"
                f" | generated / native = {gen / native:.3f} (target <= {target})"
            )


if __name__ == "__main__":
    main()
