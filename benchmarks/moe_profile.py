"""Where a MoE step's time goes: the generated 8-expert top-2 MoE (dropless and with a
capacity, serial and over ep = 2) under torch.profiler, and the host synchronisations
each MoE layer makes.

    .venv/bin/python benchmarks/moe_profile.py                 # CPU, fp32, a smaller MoE
    python3 benchmarks/moe_profile.py --device cuda            # one GPU, bf16, gpu_mfu's MoE

For each case, rank 0's top ops over the steps after two of warm-up (self time: CPU ops
on a CPU, kernels on a GPU, with the share of the step the GPU sat idle between them),
and every rank's host synchronisations: per MoE layer's forward, and in the whole step
less the optimizer (so backward's, and what wraps the layers). A synchronisation is what
makes the host wait for the device, counted on a CPU too, where it costs nothing: a
tensor's value read (item, bool, tolist, numpy), an op whose output's shape depends on
values (nonzero, a boolean mask, repeat_interleave without output_size) and a copy from
the device to the host. ep on one GPU runs its two ranks on it (--share-gpu), whose
staging copies are syncs of their own. `make gpu` profiles the serial MoE's kernels
(benchmarks/gpu_mfu.py --profile); this adds ep2 and the syncs per layer.

`moe_profile.py --inside [--profile] TRAIN_PY ARGS` is the wrapper each rank runs:
train.py as python runs it, counted from the update of step 2 to that of the last step
(tests/test_golden.py reads its SYNCS line)."""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

CPU = "mixtral { layers = 2; hidden = 256; heads = 8; kv_heads = 4; ffn = 512; vocab = 4096; seq_len = 256; experts = 8; top_k = 2 }"
GPU = ("mixtral { layers = 8; hidden = 1024; heads = 16; kv_heads = 8; ffn = 2048; vocab = 32000; seq_len = 1024;"
       " experts = 8; top_k = 2 }")
PLAN = """
cluster c {{ nodes = 1; gpus_per_node = {ep}; device = {device}
    link nvlink {{ scope = node; bandwidth = 10 GB/s; latency = 10 us }} }}
plan moe_{name} {{
    model {model}
    experts {{ {experts}aux_loss_weight = 0.01 }}
    cluster = c
    {mesh}
    train {{ steps = {steps}; micro_batch = {micro}; global_batch = {batch}; precision = {precision}; data = synthetic }}
}}
"""


def waits(func, args, kwargs) -> bool:
    """Whether the op makes the host wait for the device's values (see the docstring)."""
    import torch

    aten = torch.ops.aten
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])  # a mask's nonzero
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    if func in (aten._to_copy.default, aten.copy_.default):
        src, dst = (args[0].device, kwargs.get("device") or args[0].device) if func is aten._to_copy.default else (
            args[1].device, args[0].device)
        return src.type != "cpu" and torch.device(dst).type == "cpu"
    return torch.Tag.data_dependent_output in func.tags or torch.Tag.dynamic_output_shape in func.tags


def inside(argv: list[str]) -> None:
    """Runs train.py (argv[0]) with its arguments (--steps among them), counting host
    synchronisations from the update of step 2 to that of the last step, less the
    optimizer's (its step count is a host tensor): prints SYNCS {json} per rank. With
    --profile first, it profiles those steps instead (the optimizer's too), and rank 0
    prints PROFILE lines of its top ops."""
    import torch
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    profiling = argv[0] == "--profile"
    script, *args = argv[profiling:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.argv = [script, *args]
    import moe  # the generated layer, before train.py imports it

    where, forwards, counting, steps = collections.Counter(), [], [False], []
    last = int(args[args.index("--steps") + 1])

    def note(what: str) -> None:
        if counting[0]:
            frames = [f for f in traceback.extract_stack()[:-2] if f.filename != __file__]
            code = next((f for f in reversed(frames) if "torch" not in f.filename), frames[-1])
            where[f"{what}: {os.path.basename(code.filename)}:{code.lineno} {code.line}"] += 1

    class Syncs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if waits(func, args, kwargs):
                note(str(func))
            return func(*args, **kwargs)

    def host_read(name):  # on a CPU tensor, tolist/numpy/cpu read memory without an op
        method = getattr(torch.Tensor, name)

        def read(self, *a, **k):
            if self.device.type == "cpu":
                note(f"Tensor.{name}")
            return method(self, *a, **k)

        setattr(torch.Tensor, name, read)

    layer = moe.MoE.forward

    def forward(self, x):
        before = sum(where.values())
        out = layer(self, x)
        if counting[0]:
            forwards.append(sum(where.values()) - before)
        return out

    if profiling:  # the profile alone: the counting below would slow every op
        from torch.profiler import ProfilerActivity, profile

        window = profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * torch.cuda.is_available(), record_shapes=bool(os.environ.get("SHAPES")))
    else:
        for name in ("tolist", "numpy", "cpu"):
            host_read(name)
        moe.MoE.forward = forward
        window = Syncs()

    def update_begins(*_):
        counting[0] = False

    def update_ends(*_):  # the window: steps 3 to the last, less their updates
        steps.append(1)
        counting[0] = 2 <= len(steps) < last
        if len(steps) == 2:
            window.__enter__()
        if len(steps) == last:
            if profiling and torch.cuda.is_available():
                torch.cuda.synchronize()  # the last kernels inside the window
            window.__exit__(None, None, None)

    register_optimizer_step_pre_hook(update_begins)
    register_optimizer_step_post_hook(update_ends)
    runpy.run_path(script, run_name="__main__")
    rank = int(os.environ.get("RANK", "0"))
    if not profiling:
        print("SYNCS " + json.dumps({"rank": rank, "steps": last - 2, "forwards": forwards,
                                     "step": sum(where.values()), "where": dict(where)}), flush=True)
    elif rank == 0:
        show_profile(window, last - 2)


def show_profile(prof, steps: int) -> None:
    """PROFILE lines: the top ops by self time per step (kernels on a GPU, CPU ops on a CPU)."""
    import torch

    cuda = torch.cuda.is_available()
    events = prof.key_averages()
    time = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    ops = sorted((e for e in events if time(e) > 0), key=lambda e: -time(e))
    busy = sum(time(e) for e in ops) / 1000 / steps
    print(f"PROFILE {'kernels' if cuda else 'CPU ops'} {busy:.2f} ms a step, over {steps} steps", flush=True)
    for e in ops[:14]:
        print(f"PROFILE {time(e) / 1000 / steps / busy:6.1%} {time(e) / 1000 / steps:8.3f} ms "
              f"{e.count // steps:5d}x  {e.key[:80]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="compiled blocks (default: eager)")
    ap.add_argument("--only", help="comma-separated cases: dropless, capacity, dropless_ep2, capacity_ep2")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from common import ENV, compile_plan

    gpu = args.device == "cuda"
    cases = {"dropless": ("", 1), "capacity": ("capacity_factor = 1.25; ", 1),
             "dropless_ep2": ("", 2), "capacity_ep2": ("capacity_factor = 1.25; ", 2)}
    only = args.only.split(",") if args.only else list(cases)
    with tempfile.TemporaryDirectory() as tmp:
        for name in only:
            experts, ep = cases[name]
            micro = 8 if gpu else 4
            text = PLAN.format(name=name, ep=ep, device="h100_sxm" if gpu else "cpu", model=GPU if gpu else CPU,
                               experts=experts, mesh=f"mesh {{ ep = {ep} on nvlink }}" if ep > 1 else "",
                               steps=args.steps, micro=micro, batch=micro * ep, precision="bf16" if gpu else "fp32")
            script = compile_plan(text, Path(tmp))
            run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ep}"]
            flags = ["--steps", str(args.steps), "--log-every", "1000", "--device", args.device,
                     "--compile" if args.compile else "--no-compile"] + ["--share-gpu"] * (gpu and ep > 1)
            print(f"\n{name} ({args.device}, {'compiled' if args.compile else 'eager'}):")
            lines = []
            for profiling in (["--profile"], []):
                out = subprocess.run([*run, __file__, "--inside", *profiling, str(script), *flags],
                                     capture_output=True, text=True, env=ENV)
                if out.returncode:
                    print(f"  failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]}")
                lines += out.stdout.splitlines()
            for line in lines:
                if line.startswith("PROFILE "):
                    print("  " + line[8:])
                elif line.startswith("SYNCS "):
                    got = json.loads(line[6:])
                    layers = len(got["forwards"])
                    print(f"  rank {got['rank']}: {sum(got['forwards'])} syncs in {layers} MoE forwards "
                          f"(most {max(got['forwards'], default=0)} in one), {got['step']} in {got['steps']} "
                          f"steps less the optimizer")
                    for at, n in sorted(got["where"].items(), key=lambda kv: -kv[1]):
                        print(f"    {n:4d}  {' '.join(at.split())[:110]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inside"]:
        inside(sys.argv[2:])
    else:
        main()
