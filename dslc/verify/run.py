"""Running a compiled program as ``dslc verify`` runs it: ``python train.py`` for one
process, ``python -m torch.distributed.run --standalone --nproc-per-node=N train.py``
for several (CPU, gloo), one thread a process, in a session of its own that a timeout
ends whole. A run that fails is a :class:`RunFailed` with one line and the tail of the
standard error of the rank that failed first (torchrun's root cause)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TAIL = 2000  # characters of a failed rank's standard error shown

# The serial run of a mixture of experts, with each router's top-k choice observed: the
# smallest gap between consecutive logits among each token's k + 1 largest, over every
# call, written as JSON to the file named by the first argument. Only observes: the
# script runs unchanged, as `python train.py` runs it.
MARGIN_RUNNER = """
import json, runpy, sys, torch
out = sys.argv.pop(1)
least = [float("inf")]
topk = torch.Tensor.topk
def observed(self, k, *args, **kw):
    if self.dim() and k < self.shape[-1]:
        with torch.no_grad():
            top = topk(self.detach().float(), k + 1, dim=-1).values
            least[0] = min(least[0], float((top[..., :-1] - top[..., 1:]).min()))
    return topk(self, k, *args, **kw)
torch.Tensor.topk = observed
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = __import__("os").path.dirname(__import__("os").path.abspath(script))
try:
    runpy.run_path(script, run_name="__main__")
finally:
    with open(out, "w") as f:
        json.dump({"margin": least[0] if least[0] != float("inf") else None}, f)
"""


class RunFailed(Exception):
    """A program that could not be started, crashed or ran out of time: ``str`` is one line,
    ``tail`` the end of the failing rank's standard error."""

    def __init__(self, line: str, tail: str = ""):
        super().__init__(line)
        self.tail = tail


@dataclass(frozen=True)
class Run:
    stdout: str
    seconds: float


def launch(script: Path, nproc: int, args: list[str], timeout: float, logs: Path, margin: Path | None = None) -> Run:
    """Run ``script`` on ``nproc`` processes with ``args``; torchrun's per-rank standard
    error goes under ``logs``. ``margin``: the serial run observes its router (above)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "--log-dir", str(logs), "--redirects", "2", str(script)]
    elif margin is not None:
        cmd = [sys.executable, "-c", MARGIN_RUNNER, str(margin), str(script)]
    else:
        cmd = [sys.executable, str(script)]
    start = time.perf_counter()
    try:
        proc = subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=script.parent, start_new_session=True)
    except OSError as e:
        raise RunFailed(f"cannot start {cmd[0]}: {e.strerror or e}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        raise RunFailed(f"{_what(nproc)} ran past the timeout of {timeout:g} s", _rank_tail(err, logs)) from None
    except BaseException:  # Ctrl-C: end the processes started, not only the parent
        _kill(proc)
        raise
    if proc.returncode:
        raise RunFailed(f"{_what(nproc)} failed (exit status {proc.returncode})", _rank_tail(err, logs) if nproc > 1 else err[-TAIL:])
    return Run(out, time.perf_counter() - start)


def _what(nproc: int) -> str:
    return "the serial script" if nproc == 1 else f"the parallel script ({nproc} processes)"


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc`` and the processes it started (its session: torchrun's workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rank_tail(err: str, logs: Path) -> str:
    """The end of the standard error of the rank torchrun names as the root cause (else of
    the first rank whose log is not empty, else of torchrun's own)."""
    found = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", err, re.DOTALL)
    files = sorted(logs.glob("*/attempt_*/*/stderr.log"), key=lambda f: int(f.parent.name)) if logs.is_dir() else []
    if found:
        files = [f for f in files if f.parent.name == found.group(1)] + files
    for f in files:
        text = f.read_text(errors="replace")
        if text.strip():
            return f"rank {f.parent.name}:\n" + text[-TAIL:]
    return err[-TAIL:]
