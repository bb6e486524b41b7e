"""Generated ring attention vs the other ways to train a long sequence on N ranks; CPU + gloo.

    .venv/bin/python benchmarks/context_parallel.py [--cp 4] [--seq 4096] [--steps 8] [--repeats 3]

The same Llama (GQA), fp32, AdamW, and the same global batch of N sequences of --seq
tokens on N processes on every side, so every side trains the same tokens per step:
- ring: the script dslc emits for `mesh { cp = N }`, `context_parallel { method = ring }`
  (load-balanced chunks, K/V passed around the ring while the block in hand is attended,
  each block one fused attention call that returns its log-sum-exp, as torch's own);
- ulysses: the same with `method = ulysses` (all-to-all to whole sequences of N / cp heads);
- all-gather KV: the ring script with its attention replaced by the context parallelism
  of the Llama 3 paper (§3.3.2): every rank all-gathers the whole K and V (reduce-scatters
  their gradients) and attends its own queries under a causal mask by position;
- no cp: `mesh { dp = N }`, each rank a whole sequence (what a user pays without cp).
A run's time is the median ms per step after warm-up; the sides alternate --repeats
times, and the table and the ratio lines give each side's median over the repeats with
its range (min-max) and the median of the per-repeat ratios with theirs; the ratio
ring / all-gather KV has the target <= 1.0. The activation bytes are what autograd saves
per micro-batch on the busiest rank (`train.py --measure`, one step, in the first
repeat only: they do not change between runs): cp's point is that they fall as 1/N.
PyTorch's own context parallel
(torch.distributed.tensor.experimental.context_parallel) shards only the CUDA attention
kernels (flash, memory-efficient, cuDNN; its ring has no entry for the CPU flash kernel,
torch 2.13), so it is not a side here: the comparison with it waits for a machine with a
GPU per cp rank (NCCL refuses two ranks on one GPU).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

from common import ENV, Spread, compared, compile_plan, run

CONFIG = {"layers": 2, "hidden": 256, "heads": 8, "kv_heads": 4, "vocab": 1024}
PLAN = """
cluster cpus {{ nodes = 1; gpus_per_node = {n}; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan bench_{name} {{
    model llama {{
        layers = {layers}; hidden = {hidden}; heads = {heads}; kv_heads = {kv_heads}; vocab = {vocab}; seq_len = {seq}
    }}
    cluster = cpus
    mesh {{ {mesh} }}
    {options}
    train {{
        steps = 100; micro_batch = 1; global_batch = {n}; precision = fp32
        grad_clip = 0; optimizer adamw {{ lr = 3e-4 }}; lr_schedule constant {{ warmup = 0 }}
        data = synthetic
    }}
}}
"""
SIDES = {  # name -> (mesh, options)
    "ring": ("cp = {n} on shm", "context_parallel {{ method = ring }}"),
    "ulysses": ("cp = {n} on shm", "context_parallel {{ method = ulysses }}"),
    "allgather": ("cp = {n} on shm", "context_parallel {{ method = ring }}"),
    "nocp": ("dp = {n} on shm", ""),
}


def allgather_attention(cp_module):
    """The Llama 3 paper's context parallel, on the generated program's layout (its
    context_parallel module): K and V all-gathered over cp in rank order, each rank's
    queries attending the keys at or before their positions."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    cp, group, chunk = cp_module.CP, cp_module.GROUPS["cp"], cp_module.CHUNK
    everyone = torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for r in range(cp) for c in cp_module.cp_chunks(r)])
    allowed = everyone[None, :] <= cp_module.positions()[:, None]  # (T, cp·T)

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # (B, n, T, hs) -> (B, n, cp·T, hs), the ranks' tokens in rank order
            B, n, T, hs = x.shape
            out = x.new_empty(cp * B, n, T, hs)  # rank-major, as the tensor form gathers
            dist.all_gather_into_tensor(out, x.contiguous(), group=group)
            return out.view(cp, B, n, T, hs).permute(1, 2, 0, 3, 4).reshape(B, n, cp * T, hs)

        @staticmethod
        def backward(ctx, grad):
            B, n, S, hs = grad.shape
            parts = grad.reshape(B, n, cp, S // cp, hs).permute(2, 0, 1, 3, 4).reshape(cp * B, n, S // cp, hs)
            out = grad.new_empty(B, n, S // cp, hs)
            dist.reduce_scatter_tensor(out, parts, group=group)
            return out

    def attention(q, k, v):
        k, v = Gather.apply(k), Gather.apply(v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=q.size(1) != k.size(1))

    return attention


def worker(script: str, peer: bool) -> None:
    """Runs a generated train.py in this process; with `peer`, its model attends through
    all-gather-KV attention in place of the program's context_attention."""
    import runpy

    sys.argv = [script, *sys.argv[sys.argv.index("--") + 1 :]]
    sys.path.insert(0, str(Path(script).parent))  # the program's modules, as train.py finds them
    ns = runpy.run_path(script, run_name="bench")  # start-up and the model; main() not yet
    if peer:
        sys.modules["model"].context_attention = allgather_attention(sys.modules["context_parallel"])
    ns["main"]()


def flags(script: Path, peer: bool) -> list[str]:
    return ["--worker", str(script)] + ["--peer"] * peer + ["--"]


def side(script: Path, n: int, peer: bool, steps: int, warmup: int) -> tuple[float, list[float]]:
    """(median ms per step, losses) of one run."""
    out = run(n, __file__, *flags(script, peer), "--steps", str(steps), "--device", "cpu")
    times = [float(m) for m in re.findall(r"\| ([\d.]+) ms \|", out)]
    losses = [float(m) for m in re.findall(r"\| loss ([\d.]+) \|", out)]
    assert len(times) == steps, out
    return statistics.median(times[warmup:]), losses


def saved_bytes(script: Path, n: int, peer: bool, tmp: Path) -> int:
    """The largest saved activation bytes per micro-batch over the ranks (one step)."""
    measure = tmp / f"{script.parent.name}{'_peer' * peer}.json"
    run(n, __file__, *flags(script, peer), "--steps", "1", "--device", "cpu", "--measure", str(measure))
    return max(max(json.loads(f.read_text())["saved_per_microbatch"]) for f in tmp.glob(f"{measure.stem}.rank*.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.worker:
        worker(args.worker, args.peer)
        return

    n = args.cp
    print(f"{n} processes, CPU, gloo, fp32, OMP_NUM_THREADS={ENV['OMP_NUM_THREADS']}")
    print(f"llama {CONFIG}, {n} sequences of {args.seq} tokens per step on every side")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scripts = {}
        for name, (mesh, options) in SIDES.items():
            text = PLAN.format(name=name, n=n, seq=args.seq, mesh=mesh.format(n=n), options=options.format(), **CONFIG)
            scripts[name] = compile_plan(text, tmp / name)
        ms = {name: [] for name in SIDES}
        losses, saved = {}, {}
        for _ in range(args.repeats):
            for name, script in scripts.items():
                step, losses[name] = side(script, n, name == "allgather", args.steps, args.warmup)
                ms[name].append(step)
                if name not in saved:
                    saved[name] = saved_bytes(script, n, name == "allgather", tmp)
    drift = max(abs(a - b) / b for a, b in zip(losses["ring"], losses["allgather"]))
    print(f"{'side':<14}{'ms/step, median (min-max)':>30}{'saved activations per rank':>30}")
    for name, label in (("ring", "ring"), ("ulysses", "ulysses"), ("allgather", "all-gather KV"), ("nocp", "no cp (dp)")):
        print(f"{label:<14}{Spread.of(ms[name]).show():>30}{saved[name] / 2**20:>26.2f} MiB")
    print(compared("ring", ms["ring"], "all-gather KV", ms["allgather"], target="<= 1.0"))
    print(compared("ring", ms["ring"], "ulysses", ms["ulysses"]))
    print(compared("ring", ms["ring"], "no cp", ms["nocp"]), "(time at equal tokens)")
    print(f"saved activations: ring / all-gather KV {saved['ring'] / saved['allgather']:.3f}, "
          f"ring / no cp {saved['ring'] / saved['nocp']:.3f} (1/{n} = {1 / n:.3f}); "
          f"the last repeat's ring and all-gather losses agree within {drift:.1e}")


if __name__ == "__main__":
    main()
