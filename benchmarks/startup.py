"""The start-up of one rank of a big plan, up to its first step's weights: the generated
model built on the meta device, its parameters given storage (in the plan's precision)
and only this rank's part of each global tensor drawn (init_weights), against the way the
scripts drew before: each global tensor drawn whole on the CPU (torch's normal_, fp32)
and cut to this rank's tp part, timed on `--old-blocks` blocks and scaled to the elements
of the rank's global tensors.

    .venv/bin/python benchmarks/startup.py                       # llama3_70b, rank 0, CPU
    python3 benchmarks/startup.py --device cuda                 # drawn on the GPU

The rank's process group is not started: its coordinates are set as build_process_groups
sets them. Reads generated/<plan>/ (dslc compile plans/ writes it)."""

from __future__ import annotations

import argparse
import ast
import importlib
import math
import re
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def generated(plan: str) -> dict:
    """The modules of generated/<plan>/ that build the model, imported as train.py does."""
    folder = ROOT / "generated" / plan
    sys.path.insert(0, str(folder))
    names = ("mesh", "plan", "model", "utils")
    return {n: importlib.import_module(n) for n in names} | {"folder": folder}


def mesh_of(folder: Path) -> tuple:
    """train.py's MESH: ((axis, degree), ...), outermost first."""
    text = (folder / "train.py").read_text()
    return ast.literal_eval(re.search(r"^MESH = (.*?)  #", text, re.MULTILINE).group(1))


def timed(what: str, fn, device):
    t = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    print(f"{what:<48} {seconds:8.2f} s", flush=True)
    return out, seconds


@torch.no_grad()
def old_way(m, model, blocks: int, device) -> tuple[float, int]:
    """Seconds and elements of drawing the global tensors of the rank's first `blocks`
    blocks as the scripts did: whole on the CPU, then this rank's tp part copied in."""
    tp, rank = m["plan"].TP, m["mesh"].COORDS.get("tp", 0)
    named = [(n, p) for n, p in model.named_parameters() if n.startswith("blocks.")]
    first = sorted({n.split(".")[1] for n, _ in named}, key=int)[:blocks]
    elements, t = 0, time.perf_counter()
    for name, p in named:
        if name.split(".")[1] not in first or p.init != "normal":
            continue
        shape = list(p.shape)
        if p.tp_dim is not None:
            shape[p.tp_dim] *= tp
        full = torch.empty(shape).normal_(0.0, p.std, generator=m["utils"].generator(1234, "init", name))
        if p.tp_dim is not None:
            full = full.chunk(tp, dim=p.tp_dim)[rank]
        p.copy_(full)
        elements += math.prod(shape)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, elements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="llama3_70b")
    parser.add_argument("--rank", type=int, default=0, help="the global rank whose part is built")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--old-blocks", type=int, default=1, help="blocks the old way is timed on (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dp = ROOT / "generated" / args.plan / "data_parallel.py"
    if dp.exists() and "class FullyShardedUnits" in dp.read_text():
        sys.exit(f"{args.plan}: ZeRO-3 draws its blocks one at a time as it shards them, under its process group")
    m = generated(args.plan)
    mesh = mesh_of(m["folder"])
    stride = {a: math.prod(n for _, n in mesh[i + 1 :]) for i, (a, _) in enumerate(mesh)}
    m["mesh"].COORDS.update({a: args.rank // stride[a] % n for a, n in mesh})
    dtype = getattr(m["plan"], "PARAM_DTYPE", torch.float32)
    print(f"{args.plan}, rank {args.rank} {m['mesh'].COORDS}, {device}, {dtype}, {torch.get_num_threads()} threads")

    def on_meta():
        with torch.device("meta"):
            return m["model"].Transformer()

    model, build = timed("model built on the meta device", on_meta, device)
    _, give = timed("parameters given storage (materialize)", lambda: m["model"].materialize(model, device, dtype), device)
    _, draw = timed("this rank's parts drawn (init_weights)", lambda: m["model"].init_weights(model.named_parameters(), 1234), device)
    _, move = timed("buffers to the device (model.to)", lambda: model.to(device, dtype=dtype), device)
    held = sum(p.numel() for p in model.parameters())
    total = build + give + draw + move
    print(f"{'start-up of the model':<48} {total:8.2f} s: {held / 1e9:.2f}B parameters, {held * dtype.itemsize / 2**30:.1f} GiB,"
          f" {draw / held * 1e9:.1f} ns a parameter drawn")
    print(f"peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")
    if args.old_blocks:  # its cost an element, times the global tensors' elements
        seconds, elements = old_way(m, model, args.old_blocks, device)
        normal = [p for p in model.parameters() if p.init == "normal"]
        whole = sum(math.prod(m["model"].global_part(p)[0]) for p in normal)
        old = seconds / elements * whole
        print(f"old way: {seconds:.2f} s for {args.old_blocks} block(s), {elements / 1e9:.2f}B elements;"
              f" for the rank's {whole / 1e9:.2f}B: {old:.0f} s. Ratio new / old: {total / old:.2f}")

if __name__ == "__main__":
    main()
