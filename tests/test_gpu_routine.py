"""`make gpu`'s driver (benchmarks/gpu_routine.py) on a CPU: what it writes and says
where nothing can run, the offline install of what the GPU machine's python lacks, the
hard limit of a part, and the tests part's record; gpu_mfu.py's fp8 guard. The GPU parts
themselves run on a lent GPU only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_mfu  # noqa: E402
import gpu_routine  # noqa: E402

torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, make gpu runs the parts")
ROUTINE = str(ROOT / "benchmarks" / "gpu_routine.py")


def routine(*python, **env):
    return subprocess.run([*(python or [sys.executable]), ROUTINE], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **env))


@no_cuda
def test_without_cuda_make_gpu_says_why_in_one_line_and_marks_every_part_skipped(tmp_path):
    start = time.monotonic()
    out = routine(GPU_OUT=str(tmp_path))
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and "no CUDA device visible to torch" in out.stderr
    results = json.loads((tmp_path / "gpu-results.json").read_text())
    setup, *parts = results["parts"]
    assert setup["result"] == "failed" and setup["note"].startswith("no CUDA device visible to torch")
    assert [p["part"] for p in parts] == [name for name, _, _ in gpu_routine.PARTS]
    assert all(p["result"] == "skipped" and p["note"] == setup["note"] for p in parts)
    text = (tmp_path / "gpu-results.md").read_text()
    assert text.startswith("# make gpu: no GPU\n") and f"torch {torch.__version__}" in text
    assert all(f"| {name} | skipped | 0.0 |" in text for name, _, _ in gpu_routine.PARTS)
    assert results["budget_s"] <= 480 and time.monotonic() - start < 30


def test_a_python_without_torch_or_an_unknown_part_is_one_line(tmp_path):
    out = routine(sys.executable, "-S", GPU_OUT=str(tmp_path))  # -S: no site-packages, so no torch
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1 and "has no torch" in out.stderr
    assert json.loads((tmp_path / "gpu-results.json").read_text())["parts"][1]["result"] == "skipped"
    out = routine(GPU_OUT=str(tmp_path), GPU_PARTS="tests,mfu:nope")
    assert out.returncode == 2 and out.stderr.startswith("gpu: no part mfu:nope (the parts: tests, mfu:gpt2_124m")


def wheel(folder: Path, name: str) -> Path:
    """A wheel of one empty module, as pip installs it offline."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_what_the_python_lacks_comes_from_the_wheel_folder_or_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(gpu_routine, "REQUIRED", (*gpu_routine.REQUIRED, "dslc_gpu_missing"))
    why, installed = gpu_routine.install_missing(tmp_path / "wheels", tmp_path / "site")
    assert installed == [] and "lacks dslc_gpu_missing (" in why and "make gpu-wheels" in why
    (tmp_path / "wheels").mkdir()
    wheel(tmp_path / "wheels", "dslc_gpu_missing")
    why, installed = gpu_routine.install_missing(tmp_path / "wheels", tmp_path / "site")
    assert why is None and installed == ["dslc_gpu_missing"]  # then dslc imported with it on the path
    assert (tmp_path / "site" / "dslc_gpu_missing.py").exists()
    assert str(tmp_path / "site") in gpu_routine.part_env(tmp_path / "site")["PYTHONPATH"].split(os.pathsep)


def test_a_part_past_its_limit_is_killed_with_the_processes_it_started_in_their_own_session(tmp_path):
    """torchrun starts each rank in a session of its own: killing the part's process
    group alone would leave the ranks on the GPU."""
    grandchild = tmp_path / "pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            f"open({str(grandchild)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(60)\n")
    status, seconds = gpu_routine.run_limited([sys.executable, "-c", code], 3, tmp_path / "log", dict(os.environ))
    assert status is None and 3 <= seconds < 20
    pid = int(grandchild.read_text())
    for _ in range(50):  # reaped by whoever adopted it
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {pid} outlived its part")
    assert "(killed at the part's limit of 3 s)" in (tmp_path / "log").read_text()


@no_cuda
def test_the_tests_part_records_each_test_of_test_gpu(tmp_path, monkeypatch):
    """With the setup passed over, the tests part runs tests/test_gpu.py (every test
    skips on a CPU) and the results name each test with its outcome and reason; before
    the part, the file already says which parts did not end or run."""
    monkeypatch.setattr(gpu_routine, "probe_setup",
                        lambda wheels, site: ({"python": sys.executable, "installed": [], "missing_optional": []}, None))
    monkeypatch.setenv("GPU_TEST_WORKERS", "0")
    saved = []  # what the file says while the part runs, should the routine be stopped
    results, why = gpu_routine.routine(tmp_path, 60, ["tests"], tmp_path / "wheels", tmp_path / "site", saved.append)
    assert [(p["part"], p["result"]) for p in saved[0]["parts"][:3]] == [
        ("setup", "passed"), ("tests", "did not end"), ("mfu:gpt2_124m", "not run")]
    assert len(saved[0]["parts"]) == len(results["parts"])
    tests = results["parts"][1]
    assert why is None and tests["result"] == "passed", tests
    assert tests["note"].endswith(f"skipped of {len(tests['tests'])}")
    assert {t["outcome"] for t in tests["tests"]} == {"skipped"}
    assert {"test_parallel_plan_sharing_one_gpu_tracks_cpu_fp32[llamapp_dp2_pp2_tp2-bf16-compiled]",
            "test_bf16_mfu_is_reported"} <= {t["test"].split("::")[1] for t in tests["tests"]}
    assert all(p["result"] == "skipped" for p in results["parts"][2:])
    text = gpu_routine.markdown(results | {"date": "today", "commit": "abc"})
    assert "| test_bf16_mfu_is_reported | skipped (setup) | 0.0 | needs CUDA |" in text


def test_the_fp8_cases_and_their_bf16_twin_are_skipped_with_the_reason_until_they_can_run(monkeypatch):
    chosen = ["llama_3b", "llama_3b_fp8", "llama_3b_fp8_rowwise"]
    monkeypatch.setattr(gpu_mfu, "fp8_unready", lambda text: "E010 unknown key 'float8' in train")
    why = gpu_mfu.skipped(chosen, "h100_sxm")
    assert set(why) == set(chosen) and why["llama_3b"].endswith("E010 unknown key 'float8' in train")
    assert gpu_mfu.skipped(["llama_3b"], "h100_sxm") == {}  # asked for alone, it runs
    monkeypatch.setattr(gpu_mfu, "fp8_unready", lambda text: None)
    assert gpu_mfu.skipped(chosen, "h100_sxm") == {}


def test_every_case_of_gpu_mfu_is_a_plan_dslc_takes_or_an_fp8_case_it_says_why_not():
    from dslc.driver import load_text

    twins = {twin for twin, _, _ in gpu_mfu.OFFLOAD.values()}
    host = "host_memory = 128 GiB; host_bandwidth = 30 GB/s; link pcie { scope = node; bandwidth = 40 GB/s }"
    for name in [*gpu_mfu.CASES, *gpu_mfu.FP8, *gpu_mfu.OFFLOAD]:
        text = gpu_mfu.plan_text(name, "h100_sxm", 20, host)
        diags = [d for d in load_text(text, f"{name}.plan").diagnostics if d.is_error]
        errors = [f"{d.code} {d.message}" for d in diags]
        if name in twins:  # what an H100 cannot hold without offload, its case's point
            assert [d.code for d in diags] == ["E090"] and "offload { optimizer = true }" in diags[0].hint, errors
        elif name in gpu_mfu.FP8:
            why = gpu_mfu.fp8_unready(text)
            assert ("float8 = " in text) and (why is None) == (not errors and gpu_mfu.importlib.util.find_spec("torchao") is not None)
        else:
            assert not errors, (name, errors)


def test_a_failure_is_one_line_with_the_error_a_script_ended_with():
    message = ("AssertionError: W1128 [rank0]: Traceback (most recent call last):\n  File \"train.py\", line 9\n"
               "torch.OutOfMemoryError: CUDA out of memory.\n\nassert 1 == 0\n +  where 1 = CompletedProcess.returncode")
    assert gpu_routine.one_line(message) == ("AssertionError: W1128 [rank0]: Traceback (most recent call last): … "
                                             "torch.OutOfMemoryError: CUDA out of memory.")
    assert gpu_routine.one_line("needs CUDA") == "needs CUDA"
