"""Generated expert-parallel MoE step vs torchtitan's MoE with expert parallelism, CPU + gloo.

    .venv/bin/python benchmarks/moe_vs_peer.py [--layout ep2|ep2dp2] [--size S]
        [--steps 20] [--repeats 3] [--peer-python PY] [--serial]

Both sides run under torchrun with the same world size (ep2: 2 processes, ep2dp2: 4),
the same Mixtral-style model (RMSNorm, RoPE attention, in every layer a softmax router
sending each token to its top-2 of 4 SwiGLU experts, dropless), the same tokens per
rank and step, and the same work per step (forward, cross-entropy, backward, AdamW):
- generated: the script dslc emits for a mixtral plan with `mesh { ep = 2 }` (and
  `dp = 2`): each rank holds experts / ep experts, tokens go to them and back in two
  all-to-alls per layer, the dense weights are replicated over the ep ranks;
- peer: torchtitan 0.3.0 (benchmarks/moe_peer_torchtitan.py), its Qwen3 decoder set up as
  Mixtral, parallelized by torchtitan's own `parallelize_qwen3`: expert parallel with its
  AllToAllTokenDispatcher and torch._grouped_mm experts, FSDP2 on the dense weights
  (with EP torchtitan takes the ep ranks out of its FSDP ranks; it has no replicated
  layout for them).
Each side balances its experts its own way: the generated script adds Mixtral's
auxiliary loss, torchtitan nudges a per-expert routing bias before each optimizer step.

A run's time is the median step after warm-up. The two sides alternate --repeats times;
each line gives each side's median ms/step over the repeats with its range (min-max) and
the median of the per-repeat ratios with theirs (target <= 1.0).

The peer needs torchtitan, which is not in .venv. Set it up once beside it (the
constraint keeps pip from replacing torch with a CUDA build):

    .venv/bin/python -m venv --system-site-packages /tmp/moe-peer
    /tmp/moe-peer/bin/pip install -c benchmarks/moe_constraints.txt torchtitan triton

(triton only because torchtitan imports it at module level; nothing here runs a triton
kernel.) Without it, or with --serial, the reference is the serial plan at the same
global batch in one process: the line then says how much the ep ranks gain over one.
Megatron-Core (megatron.core.transformer.moe) was the other candidate; it does not run
on CPU (see moe_peer_torchtitan.py's docstring for both).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ENV, compared, compile_plan, generated_step_ms

HERE = Path(__file__).resolve().parent
PEER = HERE / "moe_peer_torchtitan.py"
SIZES = {
    # overhead-bound: a step is mostly routing, all-to-alls and small matmuls
    "small": dict(layers=4, hidden=64, heads=4, kv_heads=4, ffn=128, experts=4, top_k=2,
                  vocab=512, seq_len=64, micro_batch=8),
    # closer to compute-bound
    "large": dict(layers=4, hidden=256, heads=8, kv_heads=8, ffn=512, experts=4, top_k=2,
                  vocab=512, seq_len=128, micro_batch=4),
}  # fmt: skip
LAYOUTS = {"ep2": {"dp": 1, "ep": 2}, "ep2dp2": {"dp": 2, "ep": 2}}
PLAN = """
cluster cpus {{ nodes = 1; gpus_per_node = {world}; device = cpu
    link shm {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan bench_moe {{
    model mixtral {{
        layers = {layers}; hidden = {hidden}; heads = {heads}; kv_heads = {kv_heads}
        ffn = {ffn}; vocab = {vocab}; seq_len = {seq_len}
    }}
    experts {{ count = {experts}; top_k = {top_k} }}
    cluster = cpus
    {mesh}
    train {{
        steps = 100; micro_batch = {micro_batch}; global_batch = {global_batch}
        precision = fp32; grad_clip = {clip}
        optimizer adamw {{ lr = 3e-4 }}; lr_schedule constant {{ warmup = 0 }}
        data = synthetic
    }}
}}
"""
DEFAULT_PEER_PYTHON = os.environ.get("MOE_PEER_PYTHON", "/tmp/moe-peer/bin/python")


def plan_text(config: dict, dp: int, ep: int, clip: float, micro_batch: int) -> str:
    """A mixtral plan over dp x ep ranks (no mesh: one rank) with this micro-batch."""
    axes = [f"{name} = {n} on shm" for name, n in (("dp", dp), ("ep", ep)) if n > 1]
    mesh = f"mesh {{ {'; '.join(axes)} }}" if axes else ""
    sizes = dict(config, micro_batch=micro_batch, global_batch=micro_batch * dp * ep)
    return PLAN.format(world=dp * ep, mesh=mesh, clip=clip, **sizes)


def peer_missing(python: str) -> str | None:
    """Why `python` cannot run the peer, or None when it can."""
    if not Path(python).exists():
        return f"{python} does not exist"
    probe = [python, "-c", "import torchtitan.models.qwen3, torch; print(torch.__version__)"]
    out = subprocess.run(probe, capture_output=True, text=True, env=ENV)
    if out.returncode:
        return f"{python} cannot import torchtitan: {out.stderr.strip().splitlines()[-1]}"
    return None


def peer_step_ms(python: str, config: dict, dp: int, ep: int, a) -> float:
    """Median ms/step of the torchtitan peer, under torchrun with dp * ep processes."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in config.items()]
    flags += [f"--ep={ep}", f"--clip={a.clip}", f"--steps={a.steps}", f"--warmup={a.warmup}"]
    cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={dp * ep}"]
    out = subprocess.run([*cmd, str(PEER), *flags], capture_output=True, text=True, env=ENV)
    if out.returncode:
        sys.exit(f"{PEER.name} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.split()[-1])


def compare(name: str, ours, theirs, repeats: int) -> None:
    """Alternate the two timings `repeats` times and print one line."""
    gens, refs = [], []
    for _ in range(repeats):
        gens.append(ours())
        refs.append(theirs())
    print("     ", compared("generated", gens, name, refs, target="<= 1.0"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="ep2")
    ap.add_argument("--size", choices=sorted(SIZES), action="append", help="default: all")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clip", type=float, default=0.0, help="global-norm clipping, both sides")
    ap.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    ap.add_argument("--serial", action="store_true", help="compare with the serial plan")
    a = ap.parse_args()
    dp, ep = LAYOUTS[a.layout]["dp"], LAYOUTS[a.layout]["ep"]
    world = dp * ep

    missing = None if a.serial else peer_missing(a.peer_python)
    if missing:
        print(f"peer: torchtitan unavailable ({missing}); comparing with the serial plan")
    peer = "serial" if a.serial or missing else "torchtitan"
    print(
        f"{a.layout}: {world} processes, CPU, gloo, fp32, OMP_NUM_THREADS={ENV['OMP_NUM_THREADS']}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.size or list(SIZES):
            config = SIZES[size]
            mb = config["micro_batch"]
            script = compile_plan(plan_text(config, dp, ep, a.clip, mb), Path(tmp) / size)
            print(f"{size:5s} mixtral {config} (micro_batch per rank), global batch {mb * world}")

            def ours():
                return generated_step_ms(script, world, a.steps, a.warmup)

            if peer == "torchtitan":

                def theirs():
                    return peer_step_ms(a.peer_python, config, dp, ep, a)

            else:
                serial = plan_text(config, 1, 1, a.clip, mb * world)
                serial_script = compile_plan(serial, Path(tmp) / f"{size}_serial")

                def theirs():
                    return generated_step_ms(serial_script, 1, a.steps, a.warmup)

            compare(peer, ours, theirs, a.repeats)


if __name__ == "__main__":
    main()
