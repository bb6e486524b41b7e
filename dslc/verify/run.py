"""Running a compiled program as ``dslc verify`` runs it: ``python train.py`` for one
process, ``python -m torch.distributed.run --standalone --nproc-per-node=N train.py``
for several (CPU, gloo), one thread a process, in a session of its own. A timeout, Ctrl-C,
SIGTERM or SIGHUP (:func:`ending_on_signals`: what ``timeout`` and a cancelled CI job send)
ends it whole (:func:`end`): torchrun starts each rank in a session of its own, so the
processes it started are found first, asked to end, and killed after :data:`GRACE`. A run
that fails is a :class:`RunFailed` with one line and the tail of the standard error of the
rank that failed first (torchrun's root cause)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TAIL = 2000  # characters of a failed rank's standard error shown
GRACE = 10.0  # seconds a run's processes have to end after SIGTERM before they are killed
SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # what ends a verify early, cleaning up

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


class Stopped(KeyboardInterrupt):
    """A signal of :data:`SIGNALS` arrived: the run in progress is ended, its folder removed."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def ending_on_signals() -> Iterator[None]:
    """While inside, SIGTERM, SIGHUP and SIGINT raise :class:`Stopped` (once: a second signal
    does not interrupt the cleanup the first began, which :data:`GRACE` bounds), so that the
    processes of a run are ended and temporary folders removed as the exception leaves."""
    stopped = []

    def handler(signum, frame):
        if not stopped:
            stopped.append(signum)
            raise Stopped(signum)

    before = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


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
        end(proc)
        out, err = proc.communicate()
        raise RunFailed(f"{_what(nproc)} ran past the timeout of {timeout:g} s", _rank_tail(err, logs)) from None
    except BaseException:  # Ctrl-C, a signal: end the processes started, not only the parent
        end(proc)
        raise
    if proc.returncode:
        raise RunFailed(f"{_what(nproc)} failed (exit status {proc.returncode})", _rank_tail(err, logs) if nproc > 1 else err[-TAIL:])
    return Run(out, time.perf_counter() - start)


def _what(nproc: int) -> str:
    return "the serial script" if nproc == 1 else f"the parallel script ({nproc} processes)"


def end(proc: subprocess.Popen, grace: float = GRACE) -> None:
    """End ``proc`` (the leader of its own session) and every process it started. torchrun
    starts each rank in a session of its own, out of ``proc``'s process group, and a killed
    torchrun leaves them running: so every descendant is found first, each one's process
    group is sent SIGTERM (torchrun then ends its ranks itself), and what is left after
    ``grace`` seconds, found again, is sent SIGKILL."""
    family = _descendants(proc.pid)
    _signal_groups(proc.pid, family, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in family)):
        time.sleep(0.05)
    family |= _descendants(proc.pid) if proc.poll() is None else set()
    _signal_groups(proc.pid, {p for p in family if _alive(p)}, signal.SIGKILL)
    proc.wait()


def _signal_groups(leader: int, pids: set[int], sig: int) -> None:
    """``sig`` to ``leader``'s process group and to that of each of ``pids``."""
    groups = {leader}
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, sig)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, theirs, ...), from ``/proc`` (else ``ps``)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _parents() -> Iterator[tuple[int, int]]:
    """(pid, parent pid) of every process this user can see."""
    if not os.path.isdir("/proc/self"):
        out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            pid, _, ppid = line.strip().partition(" ")
            if pid.isdigit() and ppid.strip().isdigit():
                yield int(pid), int(ppid)
        return
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read(4096)
            except OSError:  # it ended meanwhile
                continue
            fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
            if len(fields) > 1:
                yield int(name), int(fields[1])


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read(4096)
        except OSError:
            return False
        return stat[stat.rfind(b")") + 2:][:1] != b"Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


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
