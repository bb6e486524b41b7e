"""How long linting one typical plan takes in-process once the grammar is
built (target: < 50 ms), next to the cost of building the grammar. Each plan is
linted `repeats` times (30); a line gives the median with its range (min-max) and
the median's ratio to the target.

    .venv/bin/python benchmarks/lint_speed.py
"""

from __future__ import annotations

import time
from pathlib import Path

from common import Spread

from dslc.driver import load_paths
from dslc.front.parse import parser

ROOT = Path(__file__).resolve().parent.parent
PLANS = [ROOT / "plans" / "llama3_8b.plan", ROOT / "plans" / "llama3_70b.plan", ROOT / "plans" / "mixtral_8x7b.plan"]


def main(repeats: int = 30) -> None:
    t0 = time.perf_counter()
    parser()
    build = time.perf_counter() - t0
    print(f"grammar build (once per process): {build * 1e3:7.1f} ms")
    for plan in PLANS:
        load_paths([plan])  # warm caches other than the grammar
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = load_paths([plan])
            times.append(time.perf_counter() - t0)
            assert not any(d.is_error for d in result.diagnostics)
        ms = Spread.of([t * 1e3 for t in times])
        print(f"lint {plan.name:<22} {ms.show('ms'):>24} over {ms.n} runs (target 50 ms)  ratio {ms.median / 50:.2f}")


if __name__ == "__main__":
    main()
