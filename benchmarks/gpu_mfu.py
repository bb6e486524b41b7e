"""MFU on one GPU: the generated serial plans in bf16, eager and compiled, beside
`dslc explain`'s prediction and a nanoGPT-style loop written here, eager and compiled.

    .venv/bin/python benchmarks/gpu_mfu.py [--steps 30] [--log-every 10] [--only gpt2_124m,moe_dropless] [--profile]
        [--json rows.jsonl]

`make gpu` (benchmarks/gpu_routine.py) runs it case by case within its time budget.

The cases: GPT-2 124M at llm.c's sequence of 1024 (micro-batch 16), a Llama of 1.2B
(Llama 3.2 1B's shape: 16 layers, hidden 2048, 32 heads / 8 kv, vocab 128256,
sequence 2048, micro-batch 4), the 8-expert top-2 MoE of tests/test_gpu.py, dropless
and with a capacity of 1.25, and a Llama 3D plan (dp2 × pp2 × tp2 with sp, 1F1B) run by
8 ranks sharing the one GPU (`--share-gpu`: gloo, collectives staged through host
memory), whose time is the staging's: its explain column is for 8 real GPUs. The fp8 cases
(`train { float8 = ... }`, torchao's float8 linears) are the 1.2B Llama and a Llama of
3.2B (Llama 3.2 3B's shape: 28 layers, hidden 3072, 24 heads / 8 kv, ffn 8192, sequence
4096, micro-batch 1), each beside the same plan in bf16, compiled both: the line after
them gives bf16 / fp8 (target >= 1.2). They are skipped, with the reason, where this dslc
does not take the plan (it lints the plan's text) or torchao is not installed; the 3B
bf16 twin is skipped with them. Each generated script runs in its own process,
`--log-every` steps between the host's reads of the device; the step time is the
mean over the steps after the first read past `--warmup` (compilation and the
allocator's growth happen before), printed with the range (min-max) of the log
intervals' means it is made of. Each row is one run, not repeated: the range is the
spread within that run, not over runs. MFU counts the model FLOPs that explain counts
(MODEL_FLOPS_PER_TOKEN in train.py) against the catalog's dense bf16 peak.

The baseline is nanoGPT's loop on the same GPT-2 (fp32 weights under bf16 autocast,
fused AdamW, clipping at 1.0, the model's cross-entropy on bf16 logits), with and
without `torch.compile(model)`: the generated compiled step should take at most its
compiled time (ratio <= 1.0, of the two rows' means). `--profile` adds, for the generated GPT-2, the kernels
that took the most GPU time over 5 steps past the warm-up and the share of each step
the GPU sat idle between them (torch.profiler); the MoE cases' too. `--json FILE` appends
each row, skip, ratio and profile to FILE as a JSON line.

Without CUDA it prints one line and exits 0."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ENV, ROOT, compile_plan, reference_gpt

from dslc.catalog import device_of_cuda_name

CLUSTER = """
cluster gpu {{ nodes = 1; gpus_per_node = {ranks}; device = {device}
    link nvlink {{ scope = node }} }}
"""
CASES = {
    "gpt2_124m": ("gpt2 { layers = 12; hidden = 768; heads = 12; vocab = 50304; seq_len = 1024 }", 16, ""),
    "llama_1b": (
        "llama { layers = 16; hidden = 2048; heads = 32; kv_heads = 8; ffn = 8192; vocab = 128256;"
        " seq_len = 2048 }",
        4,
        "",
    ),
    "moe_dropless": (
        "mixtral { layers = 8; hidden = 1024; heads = 16; kv_heads = 8; ffn = 2048; vocab = 32000;"
        " seq_len = 1024; experts = 8; top_k = 2 }",
        8,
        "experts { aux_loss_weight = 0.01 }",
    ),
}
CASES["moe_capacity"] = (*CASES["moe_dropless"][:2], "experts { capacity_factor = 1.25; aux_loss_weight = 0.01 }")
# 3D on one GPU: 8 ranks share it (--share-gpu: gloo, every collective and message staged
# through host memory), a correctness path whose time is the staging's, not a GPU's
CASES["llama_3d_shared"] = (
    "llama { layers = 8; hidden = 1024; heads = 16; kv_heads = 8; ffn = 4096; vocab = 32000; seq_len = 1024 }",
    2,
    "mesh { dp = 2 on nvlink; pp = 2 on nvlink; tp = 2 on nvlink }\n    tensor_parallel { sequence_parallel = true }\n"
    "    pipeline { schedule = 1f1b; microbatches = 4 }",
)
SHARED = {"llama_3d_shared": 8}  # the cases run on one GPU by that many ranks
# Llama 3.2 3B's shape at micro-batch 1: the fp8 target's plan (the largest Llama that
# explain fits in an H100's 80 GB at micro-batch 1 with its sequence of 4096)
CASES["llama_3b"] = (
    "llama { layers = 28; hidden = 3072; heads = 24; kv_heads = 8; ffn = 8192; vocab = 128256;"
    " seq_len = 4096 }",
    1,
    "",
)
# optimizer offload: a Llama of 4.2B whose Adam state an H100's 80 GB does not hold beside
# its weights (explain: E090 on h100_sxm, 84 GiB), trained with the fp32 master weights and
# moments on the host (70 GiB of it: the lent machine has 128 GiB), 16 micro-batches a step
CASES["llama_4b"] = (
    "llama { layers = 18; hidden = 4096; heads = 32; kv_heads = 8; ffn = 14336; vocab = 32000; seq_len = 4096 }",
    1,
    "",
)
OFFLOAD = {"llama_4b_offload": ("llama_4b", "optimizer", 16)}  # case: (twin, what it offloads, micro-batches)
# fp8 case: (its bf16 twin, the float8 recipe); the same plan with `float8 = recipe`
FP8 = {"llama_1b_fp8": ("llama_1b", "tensorwise"), "llama_3b_fp8": ("llama_3b", "tensorwise"),
       "llama_3b_fp8_rowwise": ("llama_3b", "rowwise")}
TWIN_ONLY = {"llama_3b"}  # measured for its fp8 cases' ratio: skipped when all of them are
PROFILED = ("gpt2_124m", "moe_dropless", "moe_capacity")  # what --profile profiles
GPT2 = {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50304, "seq_len": 1024, "micro_batch": 16}


def plan_text(name: str, device: str, steps: int, host: str = "") -> str:
    """``host``: what an offload case's cluster says of its host (host_figures)."""
    twin, recipe = FP8.get(name, (name, None))
    twin, offload, micro_steps = OFFLOAD.get(name, (twin, None, 1))
    model, micro_batch, more = CASES[twin]
    fp8 = f"; float8 = {recipe}" if recipe else ""
    fp8 += f"; offload {{ {offload} = true }}" if offload else ""
    ranks = SHARED.get(name, 1)
    batch = micro_batch * (4 * 2 if ranks > 1 else micro_steps)  # 3D: 4 micro-batches on each of dp 2
    cluster = CLUSTER.format(device=device, ranks=ranks)
    if offload:
        cluster = cluster.replace("device = ", f"{host} device = ")
    return cluster + f"""
plan {name} {{
    model {model}
    cluster = gpu
    {more}
    train {{ steps = {steps}; micro_batch = {micro_batch}; global_batch = {batch}; precision = bf16{fp8}; data = synthetic }}
}}
"""


def host_figures() -> str:
    """This machine's host memory, its bandwidth (a 1 GiB copy between host tensors: bytes
    read and written a second) and the GPU's pinned copies each way (the slower, GB/s), as
    a cluster writes them: what explain predicts an offload case's step from."""
    import torch

    n = 2**30
    a, b = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    b.copy_(a)
    t = time.perf_counter()
    for _ in range(3):
        b.copy_(a)
    host = 3 * 2 * n / (time.perf_counter() - t)
    pinned, gpu = torch.empty(n, dtype=torch.uint8, pin_memory=True), torch.empty(n, dtype=torch.uint8, device="cuda")
    rates = []
    for dst, src in ((gpu, pinned), (pinned, gpu)):
        dst.copy_(src, non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        rates.append(3 * n / (start.elapsed_time(end) / 1000))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return (f"host_memory = {memory // 2**30} GiB; host_bandwidth = {host / 1e9:.1f} GB/s;"
            f" link pcie {{ scope = node; bandwidth = {min(rates) / 1e9:.1f} GB/s }}")


def fp8_unready(text: str) -> str | None:
    """Why an fp8 case cannot run here (None if it can): this dslc refuses the plan's
    text (an older one does not know `float8`), or torchao is not installed."""
    from dslc.driver import load_text

    errors = [d for d in load_text(text, "fp8.plan").diagnostics if d.is_error]
    if errors:
        return f"this dslc refuses the plan: {errors[0].code} {errors[0].message}"
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (its float8 linears; make gpu-wheels brings a wheel)"
    try:
        importlib.import_module("torchao.float8")
    except Exception as e:  # a torchao built for another torch
        return f"torchao.float8 does not import: {type(e).__name__}: {e}"
    return None


def skipped(cases: list[str], device: str) -> dict[str, str]:
    """{case: why it is skipped} for the fp8 cases that cannot run and the bf16 twins
    measured only for them."""
    why = {name: r for name in cases if name in FP8 and (r := fp8_unready(plan_text(name, device, 1)))}
    for twin in TWIN_ONLY & set(cases):
        fp8 = [name for name in cases if FP8.get(name, ("",))[0] == twin]
        if fp8 and all(name in why for name in fp8):
            why[twin] = f"measured for {', '.join(fp8)} only, skipped: {why[fp8[0]]}"
    return why


def emit(path: str | None, **row) -> None:
    """One JSON line of --json FILE: a row, a skip, a ratio or a profile."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def tokens_per_step(name: str) -> int:
    text = plan_text(name, "h100_sxm", 1)
    return int(re.search(r"global_batch = (\d+)", text).group(1)) * int(re.search(r"seq_len = (\d+)", text).group(1))


def explain(text: str, folder: Path) -> dict:
    """dslc explain --json of the plan: step time, MFU and memory as it predicts them."""
    path = folder / "plan.plan"
    path.write_text(text)
    out = subprocess.run([sys.executable, "-m", "dslc", "explain", str(path), "--json"],
                         capture_output=True, text=True, cwd=ROOT, env=ENV)
    got = json.loads(out.stdout)
    return {"ms": 1000 * got["step_time_s"], "mfu": got["mfu"], "gib": got["memory"][0]["allocated"] / 2**30}


def steady(lines: list[str], warmup: int) -> dict:
    """Mean ms per step over the log lines whose interval starts past the warm-up (each
    line's ms is the mean over the steps since the line before it), and the lowest and
    highest of those lines' ms."""
    rows = [(int(m.group(1)), float(m.group(2))) for m in
            (re.search(r"^step (\d+)/\d+ .*?\| ([\d.]+) ms \|", line) for line in lines) if m]
    spans = [(step - before, ms) for (before, _), (step, ms) in zip([(0, 0.0), *rows], rows) if before >= warmup]
    return {"ms": sum(n * ms for n, ms in spans) / sum(n for n, _ in spans),
            "low": min(ms for _, ms in spans), "high": max(ms for _, ms in spans)}


def run_generated(script: Path, steps: int, log_every: int, warmup: int, compiled: bool, ranks: int = 1) -> dict:
    flag = "--compile" if compiled else "--no-compile"
    cmd = [sys.executable, str(script), "--steps", str(steps), "--log-every", str(log_every), flag]
    if ranks > 1:  # torchrun, every rank on this one GPU
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *cmd[1:], "--share-gpu"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {**steady(out.stdout.splitlines(), warmup),
            "gib": float(re.findall(r"peak mem ([\d.]+) GiB", out.stdout)[-1])}


def baseline(steps: int, log_every: int, warmup: int, compiled: bool) -> dict:
    """nanoGPT's loop on GPT2, in this process: (ms/step past the warm-up, peak GiB)."""
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = reference_gpt(GPT2).cuda()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=True)
    step_fn = torch.compile(model) if compiled else model
    B, T, V = GPT2["micro_batch"], GPT2["seq_len"], GPT2["vocab"]
    lines, last, t_read = [], 0, time.perf_counter()
    for step in range(steps):
        batch = torch.randint(V, (B, T + 1)).pin_memory().cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step + 1 == steps:
            loss.item()  # as nanoGPT: the host waits for the device on log steps only
            ms = 1000 * (time.perf_counter() - t_read) / (step + 1 - last)
            lines.append(f"step {step + 1}/{steps} | {ms:.3f} ms |")
            last, t_read = step + 1, time.perf_counter()
    return {**steady(lines, warmup), "gib": torch.cuda.max_memory_allocated() / 2**30}


PROFILE = r"""
import os, runpy, sys, time, torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.optim.optimizer import register_optimizer_step_post_hook
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script, *sys.argv[2:]]
marks = []
prof = profile(activities=[ProfilerActivity.CUDA], schedule=schedule(wait=6, warmup=2, active=5))
def tick(*_):
    torch.cuda.synchronize()
    marks.append(time.perf_counter())
    prof.step()
register_optimizer_step_post_hook(tick)
with prof:
    runpy.run_path(script, run_name="__main__")
kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
busy = sum(e.self_device_time_total for e in kernels) / 1000 / 5
wall = 1000 * (marks[12] - marks[7]) / 5  # the active steps 8-12
print(f"PROFILE kernels {busy:.2f} ms of {wall:.2f} ms a step: the GPU idle {1 - busy / wall:.0%} of it")
for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]:
    share = e.self_device_time_total / 1000 / 5 / wall
    print(f"PROFILE {share:6.1%} {e.self_device_time_total / 1000 / 5:7.2f} ms {e.count // 5:5d}x  {e.key[:90]}")
"""


def profile(script: Path, compiled: bool) -> list[str]:
    flag = "--compile" if compiled else "--no-compile"
    out = subprocess.run([sys.executable, "-c", PROFILE, str(script), "--steps", "14", flag],
                         capture_output=True, text=True, env=ENV)
    if out.returncode:
        return [f"profile failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]}"]
    return [line[8:] for line in out.stdout.splitlines() if line.startswith("PROFILE ")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the mean")
    ap.add_argument("--only", help="comma-separated cases (default: all)")
    ap.add_argument("--modes", default="eager,compiled", help="eager, compiled or both (default)")
    ap.add_argument("--profile", action="store_true", help="the top kernels of the generated GPT-2 and MoE")
    ap.add_argument("--json", metavar="FILE", help="append each row, skip, ratio and profile as a JSON line")
    ap.add_argument("--baseline-worker", choices=["eager", "compiled"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    if args.baseline_worker:
        print(json.dumps(baseline(args.steps, args.log_every, args.warmup, args.baseline_worker == "compiled")))
        return
    if not torch.cuda.is_available():
        print(f"gpu_mfu: no CUDA device visible to torch {torch.__version__}: nothing measured")
        return
    device = device_of_cuda_name(torch.cuda.get_device_name())
    if device is None:
        print(f"gpu_mfu: dslc's catalog has no peak for {torch.cuda.get_device_name()}: no MFU to print")
        return
    named = [*CASES, *FP8, *OFFLOAD]
    twins = {twin for twin, _, _ in OFFLOAD.values()}  # run only when asked for: they hold what H100s cannot
    cases = args.only.split(",") if args.only else [c for c in named if c not in twins]
    unknown = [name for name in cases if name not in named]
    if unknown:
        sys.exit(f"gpu_mfu: no case {', '.join(unknown)} (the cases: {', '.join(named)})")
    host = host_figures() if any(c in OFFLOAD for c in cases) else ""
    why = skipped(cases, device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, one process, one run per row;"
          f" ms/step: the mean past the warm-up (min-max of its log intervals)")
    header = f"{'case':14} {'run':22} {'ms/step':>8} {'(min-max)':>17} {'tok/s':>9} {'MFU':>6} {'GiB':>6}   explain: {'ms':>6} {'MFU':>6} {'GiB':>6}  ms/explain"
    print(header)
    compiled = {}  # case: its generated compiled run, for the fp8 ratios
    with tempfile.TemporaryDirectory() as tmp:
        for name in cases:
            if name in why:
                print(f"{name:14} skipped: {why[name]}", flush=True)
                emit(args.json, case=name, skipped=why[name])
                continue
            folder = Path(tmp) / name
            folder.mkdir()
            text = plan_text(name, device, args.steps, host)
            predicted = explain(text, folder)
            script = compile_plan(text, folder / "out")
            tokens = tokens_per_step(name)
            modes = args.modes.split(",")
            # the script's own MFU constants, as explain counts them
            constants = script.read_text()
            flops = int(re.search(r"MODEL_FLOPS_PER_TOKEN = ([\d_]+)", constants).group(1).replace("_", ""))
            peak = float(re.search(r"PEAK_FLOPS = ([\d.e]+)", constants).group(1))

            def show(label: str, r: dict) -> tuple[str, dict]:
                """Print and emit a run's row as soon as it is measured."""
                if "error" in r:
                    print(f"{name:14} {label:22} failed: {r['error']}", flush=True)
                    emit(args.json, case=name, run=label, error=r["error"])
                    return label, r
                mfu = flops * tokens / (r["ms"] / 1000) / peak
                spread = f"({r['low']:.2f}-{r['high']:.2f})"
                print(f"{name:14} {label:22} {r['ms']:8.2f} {spread:>17} {tokens / r['ms'] * 1000:9,.0f} {mfu:6.1%} {r['gib']:6.2f}"
                      f"   explain: {predicted['ms']:6.2f} {predicted['mfu']:6.1%} {predicted['gib']:6.2f}"
                      f"  {r['ms'] / predicted['ms']:.2f}", flush=True)
                emit(args.json, case=name, run=label, **r, tok_s=tokens / r["ms"] * 1000, mfu=mfu, explain=predicted)
                return label, r

            runs = [show(f"generated {m}", run_generated(script, args.steps, args.log_every, args.warmup,
                                                          m == "compiled", SHARED.get(name, 1))) for m in modes]
            if name == "gpt2_124m":
                for m in modes:
                    cmd = [sys.executable, __file__, "--baseline-worker", m, "--steps", str(args.steps),
                           "--log-every", str(args.log_every), "--warmup", str(args.warmup)]
                    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
                    got = (json.loads(out.stdout) if out.returncode == 0
                           else {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:200]})
                    runs.append(show(f"nanoGPT loop {m}", got))
            ours = dict(runs)
            compiled[name] = ours.get("generated compiled", {})
            if name == "gpt2_124m" and "ms" in compiled[name] and "ms" in ours.get("nanoGPT loop compiled", {}):
                ratio = compiled[name]["ms"] / ours["nanoGPT loop compiled"]["ms"]
                print(f"gpt2_124m: generated compiled / nanoGPT loop compiled = {ratio:.2f}"
                      " (the means of one run each; target <= 1.0)")
                emit(args.json, case=name, ratio="generated compiled / nanoGPT loop compiled", value=ratio,
                     target="<= 1.0")
            if name in OFFLOAD and "ms" in compiled[name]:
                from dslc.driver import load_text

                on_h100 = plan_text(OFFLOAD[name][0], "h100_sxm", args.steps, host).replace("global_batch = 1;", "global_batch = 16;")
                refused = [d.message for d in load_text(on_h100, "h100.plan").diagnostics if d.code == "E090"]
                ratio = compiled[name]["ms"] / predicted["ms"]
                print(f"{name}: measured / explain = {ratio:.2f} (target within 15 %), host {host};"
                      f" without offload on an H100: {refused[0] if refused else 'fits (no E090)'}")
                emit(args.json, case=name, ratio="measured / explain", value=ratio, target="within 15 %", host=host,
                     without_offload_on_h100=refused[0] if refused else None)
            if args.profile and name in PROFILED:
                for m in modes:
                    lines = profile(script, m == "compiled")
                    print(f"\nprofile of the generated {name}, {m}:\n" + "\n".join(lines), flush=True)
                    emit(args.json, case=name, profile=m, lines=lines)
        for name, (twin, recipe) in FP8.items():
            if "ms" in compiled.get(name, {}) and "ms" in compiled.get(twin, {}):
                ratio = compiled[twin]["ms"] / compiled[name]["ms"]
                print(f"{name}: bf16 compiled / fp8 ({recipe}) compiled = {ratio:.2f}"
                      " (the means of one run each; target >= 1.2)")
                emit(args.json, case=name, ratio=f"bf16 compiled / fp8 {recipe} compiled", value=ratio,
                     target=">= 1.2")


if __name__ == "__main__":
    main()
