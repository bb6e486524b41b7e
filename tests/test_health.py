"""A slow rank named: the stragglers' log at log steps and --health-check before the first
step (the generated health.py), on CPU processes under torchrun with gloo.

A rank is slowed from outside, as a bad GPU or a busy host slows one: the test stops its
process with SIGSTOP and continues it with SIGCONT, stopped STOPPED of every PERIOD
seconds, so it runs at less than a third of its peers' pace. That is far beyond the
thresholds (a straggler: 20 % above its group's median compute; the health check refuses
a rank below half its peers' median GEMM rate), and the other ranks of a shared 2-core
machine stay well within them, so the tests need no retry. The ranks' process ids come
from test_checkpoint's sitecustomize (PID_DIR)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from test_checkpoint import gpt2_plan, launcher

pytestmark = pytest.mark.slow

PERIOD, STOPPED = 0.3, 0.21  # seconds: the slowed rank runs 30 % of the time
# a GPT-2 whose steps are mostly compute, even on 2 shared cores: a stop lands in compute
# far more often than in a collective, where the timers cannot tell a stopped rank from
# its waiting peer
# (a layer per rank of the pipeline)
MODEL = "hidden = 512; heads = 4; vocab = 250; seq_len = 128"


@pytest.fixture
def launch(run_script, tmp_path):
    return launcher(run_script, tmp_path)


class Slowed:
    """While in a `with`: the rank's process (its pid from PID_DIR, once it has started)
    stopped STOPPED of every PERIOD seconds; continued for good on leaving."""

    def __init__(self, folder: Path, rank: int, stopped=STOPPED):
        self.file, self.done, self.stopped = folder / str(rank), threading.Event(), stopped
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.file.exists() or not self.file.read_text():
            if self.done.wait(0.01):
                return
        pid = int(self.file.read_text())
        try:
            while not self.done.is_set():
                os.kill(pid, signal.SIGSTOP)
                time.sleep(self.stopped)
                os.kill(pid, signal.SIGCONT)
                self.done.wait(PERIOD - self.stopped)
        except ProcessLookupError:  # it has ended
            return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def slowed_run(tmp_path, launch, layout, rank, *flags, ok=True, stopped=STOPPED):
    plan = gpt2_plan(tmp_path, layout, tmp_path / "ck", every=1000, model=f"layers = {2 if 'pp' in layout else 1}; {MODEL}")
    pids = tmp_path / "pids"
    pids.mkdir()
    with Slowed(pids, rank, stopped):
        _, _, out = launch(plan, *flags, fail={"PID_DIR": str(pids)}, ok=ok)
    return out


@pytest.mark.parametrize("layout, rank, coords, groups", [
    ("dp2_tp2", 3, "dp 1 tp 1", ("tp group [2, 3]", "dp group [1, 3]")),
    ("pp2", 1, "pp 1", ("pp group [0, 1]",)),
])
def test_a_slowed_rank_is_named_with_its_coordinates_and_group(tmp_path, launch, layout, rank, coords, groups):
    """The stopped rank is named at the log steps, with its host, coordinates and the
    groups it slows (and their link); in stragglers.jsonl; and the end of the run's
    summary names it most often."""
    run_dir = tmp_path / "run"
    out = slowed_run(tmp_path, launch, layout, rank, "--steps", 12, "--log-every", 4, "--run-dir", run_dir)
    who = f"rank {rank} (host {os.uname().nodename}, cpu, {coords})"
    named = [ln for ln in out.stdout.splitlines() if "straggler " + who in ln]
    assert len(named) >= 2, out.stdout
    assert all(g in " ".join(named) for g in groups) and "(shm: " in named[0], named
    summary = next(ln for ln in out.stdout.splitlines() if ln.startswith("stragglers: "))
    assert summary.startswith("stragglers: " + who), summary
    records = [json.loads(ln) for ln in (run_dir / "stragglers.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]
    assert sum(any(s["rank"] == rank for s in r["stragglers"]) for r in records) >= 2
    assert records[-1]["summary"][0]["rank"] == rank


def test_the_health_check_refuses_a_rank_whose_gemms_are_slow(tmp_path, launch):
    """Rank 3 stopped 90 % of the time during the check: the job does not start, and its
    one line per outlier names rank 3's GEMMs with its host and device. (Stopped 70 %,
    its rate is about a quarter of its peers', but while it is stopped they have its
    share of the two cores, and a busy machine can bring that near half: 90 % keeps the
    gap unmistakable.)"""
    out = slowed_run(tmp_path, launch, "dp2_tp2", 3, "--steps", 1, "--health-check", ok=False, stopped=0.27)
    assert out.returncode != 0
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("train.py: error: health check: ")]
    gemms = [ln for ln in lines if "GEMMs at" in ln]
    assert gemms and all(f"rank 3 (host {os.uname().nodename}, cpu, dp 1 tp 1)" in ln for ln in gemms), lines
    assert 'train.py", line' not in out.stderr


def test_the_health_check_passes_an_idle_machine_within_its_budget(tmp_path, launch):
    """No rank slowed: the check passes, and within a few seconds (GEMMs for 1 s, five
    all-reduces of 16 MiB per group)."""
    plan = gpt2_plan(tmp_path, "dp2_tp2", tmp_path / "ck", every=1000)
    _, _, out = launch(plan, "--steps", 1, "--health-check")
    passed = re.search(r"health check: 4 ranks passed in ([\d.]+) s", out.stdout)
    assert passed and float(passed[1]) < 5, out.stdout


def test_a_run_dir_that_cannot_be_written_is_refused_before_the_first_step(tmp_path, launch):
    """--run-dir where a file is: one line from each rank before training, no traceback."""
    (tmp_path / "taken").write_text("")
    plan = gpt2_plan(tmp_path, "pp2", tmp_path / "ck", every=1000)
    _, _, out = launch(plan, "--run-dir", tmp_path / "taken", ok=False)
    assert out.returncode != 0 and "step 1/" not in out.stdout
    assert f"train.py: error: --run-dir {tmp_path / 'taken'}: is a file, not a directory" in out.stderr
    assert 'train.py", line' not in out.stderr
