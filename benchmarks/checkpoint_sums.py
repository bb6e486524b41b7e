"""What checking a checkpoint costs: the generated scripts' save (DCP's writer, plus each
item's SHA-256 read back from the page cache and manifest.json) and load (the metadata
rebuilt from manifest.json, each item read through the bounded reader and its sum checked
before torch.load) against DCP's own FileSystemWriter and FileSystemReader, on the same
tensors, in one process, in alternating repeats.

    .venv/bin/python benchmarks/checkpoint_sums.py              # 512 MiB in 64 tensors
    .venv/bin/python benchmarks/checkpoint_sums.py --mib 2048

Reads generated/llama3_8b/checkpoint_files.py (dslc compile plans/ writes it); the folder
is a temporary one on the disk of --dir (default: the system's temporary folder)."""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from common import ROOT, compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="the checkpoint's size")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the checkpoints are written")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # DCP's: no process group, one process
    sys.path.insert(0, str(ROOT / "generated" / "llama3_8b"))
    files = importlib.import_module("checkpoint_files")
    n = args.mib * 2**20 // 4 // args.tensors
    state = {f"t{i}": torch.randn(n) for i in range(args.tensors)}
    wanted = {k: (list(t.shape), t.dtype) for k, t in state.items()}
    save = {"ours": [], "dcp": []}
    load = {"ours": [], "dcp": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeats):
            for side in ("ours", "dcp"):
                folder = Path(tmp) / f"{side}{r}"
                writer = files.CheckpointWriter(str(folder)) if side == "ours" else dcp.FileSystemWriter(str(folder))
                began = time.perf_counter()
                dcp.save(state, storage_writer=writer, no_dist=True)
                save[side].append(time.perf_counter() - began)
                into = {k: torch.empty_like(t) for k, t in state.items()}
                began = time.perf_counter()
                if side == "ours":
                    metadata = files.read_manifest(str(folder), writer.manifest, wanted)
                    reader = files.CheckpointReader(str(folder), metadata)
                else:
                    reader = dcp.FileSystemReader(str(folder))
                dcp.load(into, storage_reader=reader, no_dist=True)
                load[side].append(time.perf_counter() - began)
                assert all(torch.equal(into[k], state[k]) for k in state)
                shutil.rmtree(folder)
    print(f"{args.mib} MiB in {args.tensors} fp32 tensors, {args.repeats} repeats, {torch.get_num_threads()} threads")
    print("save: " + compared("checked", save["ours"], "DCP", save["dcp"], unit="s", target="<= 1.5"))
    print("load: " + compared("checked", load["ours"], "DCP", load["dcp"], unit="s", target="<= 1.5"))


if __name__ == "__main__":
    main()
