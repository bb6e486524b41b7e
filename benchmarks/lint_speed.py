"""How long linting one typical plan takes in-process once the grammar is
built (target: < 50 ms), next to the cost of building the grammar.

    .venv/bin/python benchmarks/lint_speed.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

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
        med = statistics.median(times)
        print(f"lint {plan.name:<22} median {med * 1e3:6.2f} ms  (max {max(times) * 1e3:6.2f} ms, target 50 ms)  ratio {med / 0.050:.2f}")


if __name__ == "__main__":
    main()
