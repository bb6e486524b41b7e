"""Shared fixtures: the golden plans, a launcher for generated scripts and the cached
training runs of the golden tests; the hypothesis profile for CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# CI (CI=true, as .ci/run is run) replays the same examples every time, so a landing
# is never decided by a random draw; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
GOLDEN = ROOT / "tests" / "golden"


@pytest.fixture(scope="session")
def golden_plans():
    """Every plan of tests/golden/*.plan by name (lowered and checked: no errors)."""
    from dslc.driver import load_paths

    res = load_paths(sorted(GOLDEN.glob("*.plan")))
    errors = [f"{d.span}: {d.code} {d.message}" for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return {p.name: p for p in res.program.plans}


@pytest.fixture(scope="session")
def run_script():
    """run(train_py, nproc, *args, env=..., torchrun=...) -> CompletedProcess: one process
    with python (no torchrun variables unless ``env`` sets them), more with torchrun
    --standalone (a free port each time, so runs may overlap) and its extra flags."""

    def run(train_py: Path, nproc: int, *args: str, timeout: float = 600, cwd=None, env=None, torchrun=()):
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *map(str, torchrun)]
            cmd += [f"--nproc-per-node={nproc}", str(train_py)]
        else:
            cmd = [sys.executable, str(train_py)]
        torchrun = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
        env = {k: v for k, v in os.environ.items() if k not in torchrun} | {
            "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(env or {})
        }
        return subprocess.run(
            cmd + [str(a) for a in args],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
        )

    return run


@pytest.fixture(scope="session")
def trained(run_script, tmp_path_factory):
    """trained(plan, *flags) -> (losses, weights): the plan compiled and run (torchrun
    for more than one process) with --dump-losses and --dump-weights, at most once per
    plan name and flags; trained.logs[(name, flags)] is its standard output and
    trained.validation[(name, flags)] its validation losses, [step, loss] each."""
    torch = pytest.importorskip("torch")
    from dslc import codegen

    root = tmp_path_factory.mktemp("golden")
    cache = {}

    def train(plan, *args):
        key = (plan.name, args)
        if key not in cache:
            script = codegen.write(plan, root) / "train.py"
            losses, weights = root / f"{plan.name}.json", root / f"{plan.name}.pt"
            flags = ["--dump-losses", losses, "--dump-weights", weights, *args]
            out = run_script(script, plan.world_size, *flags)
            assert (
                out.returncode == 0
            ), f"{plan.name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
            dumped = json.loads(losses.read_text())
            cache[key] = (dumped["loss"], torch.load(weights))
            train.logs[key] = out.stdout
            train.validation[key] = dumped["val_loss"]
        return cache[key]

    train.logs, train.validation = {}, {}
    return train
