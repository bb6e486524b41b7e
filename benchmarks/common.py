"""What the benchmarks share: running a program (under torchrun for more than one
process) with one intra-op thread per process unless OMP_NUM_THREADS says otherwise,
reading a generated script's step times, compiling plan text, the reference GPT-2
built from stock torch modules that the generated scripts are compared with, and the
way every benchmark reports its repeats: the median and the spread (min-max), never
the best run (Spread, compared).

torch is imported inside the functions that need it, so that a benchmark's driver
process stays light."""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
ENV.setdefault("PYTHONWARNINGS", "ignore")


def figure(x: float) -> str:
    """x to three significant figures, no exponent: 0.912, 48.5, 845, 6505."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


@dataclass(frozen=True)
class Spread:
    """The median of a benchmark's per-repeat values and their range."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        assert values, "no repeats"
        return cls(statistics.median(values), min(values), max(values), len(values))

    def show(self, unit: str = "") -> str:
        """'845 ms/step (812-870)': the median, then the lowest and highest repeat."""
        unit = f" {unit}" if unit else ""
        return f"{figure(self.median)}{unit} ({figure(self.low)}-{figure(self.high)})"


def compared(
    ours_name: str,
    ours: Sequence[float],
    peer_name: str,
    peer: Sequence[float],
    unit: str = "ms/step",
    target: str = "",
) -> str:
    """One line for two sides timed in alternating repeats (ours[i] beside peer[i]): each
    side's median with its spread, the median of the per-repeat ratios ours / peer with
    theirs, and the number of repeats."""
    ratios = Spread.of([a / b for a, b in zip(ours, peer, strict=True)])
    line = (
        f"{ours_name} {Spread.of(ours).show(unit)} | {peer_name} {Spread.of(peer).show(unit)}"
        f" | {ours_name} / {peer_name} {ratios.show()}, {ratios.n} repeat{'s' * (ratios.n != 1)}"
    )
    return f"{line} (target {target})" if target else line


def run(nproc: int, *args: str) -> str:
    """The stdout of `python ARGS` (nproc = 1) or `torchrun --nproc-per-node nproc ARGS`."""
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, env=ENV)
    if out.returncode:
        sys.exit(f"{' '.join(args[:1])} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def generated_step_ms(script: Path, nproc: int, steps: int, warmup: int) -> float:
    """Median ms per step of a generated train.py after `warmup` steps (from its log)."""
    out = run(nproc, str(script), "--steps", str(steps), "--device", "cpu")
    times = [float(m) for m in re.findall(r"\| ([\d.]+) ms \|", out)]
    assert len(times) == steps, out
    return statistics.median(times[warmup:])


def compile_plan(text: str, out_dir: Path) -> Path:
    """train.py of the (only) plan in `text`, compiled by dslc into out_dir."""
    sys.path.insert(0, str(ROOT))
    from dslc import codegen
    from dslc.driver import load_text

    plan = load_text(text, "bench.plan").program.plans[0]
    return codegen.write(plan, out_dir) / "train.py"


def reference_block(hidden: int, heads: int, seq_len: int, tp: int = 1):
    """The GPT-2 block of the generated scripts, from nn.Linear / nn.LayerNorm; with
    tp > 1 it computes heads // tp heads, as it does once q, k, v are column-parallel."""
    import torch.nn.functional as F
    from torch import nn

    h, T, hs = hidden, seq_len, hidden // heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
            self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
            self.n_head = heads // tp

        def forward(self, x):
            B = x.size(0)
            y = self.ln_1(x)
            q, k, v = (
                m(y).view(B, T, self.n_head, hs).transpose(1, 2) for m in (self.q, self.k, self.v)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
            return x + self.down(F.gelu(self.up(self.ln_2(x)), approximate="tanh"))

    return Block()


def reference_gpt(config: dict, tp: int = 1):
    """GPT-2 with a tied head from reference_block; forward(idx, targets) -> loss."""
    import torch.nn.functional as F
    from torch import nn

    h, T = config["hidden"], config["seq_len"]

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(config["vocab"], h), nn.Embedding(T, h)
            self.blocks = nn.ModuleList(
                reference_block(h, config["heads"], T, tp) for _ in range(config["layers"])
            )
            self.ln_f = nn.LayerNorm(h)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe.weight[:T]
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return GPT()


def adamw(params):
    """AdamW as the generated scripts configure it: decay on matrices only."""
    import torch

    params = list(params)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95))


def timed_steps(model, config: dict, steps: int, clip: float = 0.0) -> list[float]:
    """Seconds of each of `steps` training steps of a reference_gpt model: a batch drawn
    from a generator keyed by the step, forward, backward, optional global-norm
    clipping, AdamW."""
    import torch

    opt = adamw(model.parameters())
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(step)
        shape = (config["micro_batch"], config["seq_len"] + 1)
        batch = torch.randint(config["vocab"], shape, generator=g)
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return times
