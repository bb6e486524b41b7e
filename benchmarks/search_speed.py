"""How long ``dslc search`` takes (issue 30): Llama 3 70B on its 64 GPUs and on 1,024, and
Llama 3 405B on 16,384 (benchmarks/published/llama3_405b.plan).

Targets: the 1,024-GPU search in under 10 s and the 16,384-GPU one in under 60 s, from
process start, as a user runs ``dslc search`` (the command is run, not the function). The
peer, timed in the same run, is ``dslc explain`` of the same plan from process start: the
ratio says how many explains a search costs, whatever the machine. Each side runs
``--repeats`` times (3), alternating; a row gives the medians with their range and the
median of the per-repeat ratios. Run: ``python benchmarks/search_speed.py``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from common import ROOT, Spread

DSLC = [sys.executable, "-m", "dslc"]
CASES = [  # (label, plan file, extra search arguments, target seconds)
    ("llama3_70b on 64 GPUs", "plans/llama3_70b.plan", [], 10.0),
    ("llama3_70b on 1,024 GPUs", "plans/llama3_70b.plan", ["--gpus", "1024"], 10.0),
    ("llama3_405b on 16,384 GPUs", "benchmarks/published/llama3_405b.plan", [], 60.0),
]


def timed(argv: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| search | search (s) | explain (s) | search / explain | target | met? |")
    print("|---|---|---|---|---|---|")
    for label, plan, extra, target in CASES:
        search, explain, ratio = [], [], []
        for _ in range(args.repeats):
            search.append(timed([*DSLC, "search", plan, "-q", *extra]))
            explain.append(timed([*DSLC, "explain", plan, "-q"]))
            ratio.append(search[-1] / explain[-1])
        s, e, r = Spread.of(search), Spread.of(explain), Spread.of(ratio)
        met = "yes" if s.median < target else "**no**"
        print(f"| {label} | {s.show()} | {e.show()} | {r.show()} | < {target:g} s | {met} |", flush=True)


if __name__ == "__main__":
    main()
