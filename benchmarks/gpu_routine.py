"""`make gpu`: every axis on one GPU in one command, within 8 minutes, into one file.

    make gpu                              # or: python3 benchmarks/gpu_routine.py
    GPU_PARTS=mfu:llama_3b,mfu:eager GPU_BUDGET_S=240 make gpu   # a second call: parts the first left

Whoever is lent a GPU runs it first. It runs, in this order, each part under its own
time limit (past it, the part's processes are killed and what it wrote is kept) and all
of them within GPU_BUDGET_S (480 s; a part is not started with under MIN_START_S left):

- setup: the interpreter (the `python3` that holds torch with CUDA; no venv is needed),
  the card (torch.cuda.get_device_name), torch's and CUDA's versions, and dslc's own
  dependencies: a module the interpreter lacks is installed from the wheels in
  GPU_WHEELS (build/gpu-wheels, which `make gpu-wheels` downloads where pip reaches
  PyPI, for a machine that cannot) into build/gpu-site, never from the network;
- tests: tests/test_gpu.py (a plan per axis and a 3D plan with --share-gpu, compiled and
  eager, bf16 and fp32; the serial plans; the MoE, MFU and host-sync checks), on
  GPU_TEST_WORKERS (6) pytest-xdist workers where it is installed, each test's outcome
  recorded as it ends;
- mfu:CASE: benchmarks/gpu_mfu.py, a case (or an fp8 case and its bf16 twin) at a time,
  compiled, with --profile for GPT-2 and the MoE; the eager rows last.

It writes into GPU_OUT (else OUT, else build/gpu/): gpu-results.md (the card, torch,
each part's result and seconds, the tests that failed, the benchmark's table, ratios
and profiles: what the README's "On one GPU" section is filled from), gpu-results.json
(the same, whole), tests.log and mfu.log; the results before each part too, the part
under way marked 'did not end', should the routine be stopped. Without torch or CUDA, or with a dependency
missing, it writes the same file with every part skipped and the reason, prints that
reason in one line and exits 1; it exits 1 too when a part failed."""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 480  # the whole routine: 8 minutes
MIN_START_S = 45  # a part is not started with less left than this
# what dslc, its codegen (black) and tests/conftest.py import; then what only some
# parts need (xdist: the tests' workers; torchao: the fp8 rows)
REQUIRED = ("lark", "interegular", "jinja2", "networkx", "rich", "black", "pytokens", "platformdirs",
            "pytest", "hypothesis", "numpy")
OPTIONAL = ("xdist", "torchao")
MFU = ["benchmarks/gpu_mfu.py", "--steps", "20", "--log-every", "5", "--warmup", "10"]
# (part, its limit in seconds, its command's arguments after the interpreter); the mfu
# parts in the order the issues need their rows
PARTS = [
    ("tests", 240, None),
    ("mfu:gpt2_124m", 120, [*MFU, "--only", "gpt2_124m", "--modes", "compiled", "--profile"]),
    ("mfu:moe_dropless", 90, [*MFU, "--only", "moe_dropless", "--modes", "compiled", "--profile"]),
    ("mfu:moe_capacity", 90, [*MFU, "--only", "moe_capacity", "--modes", "compiled", "--profile"]),
    ("mfu:llama_1b", 150, [*MFU, "--only", "llama_1b,llama_1b_fp8", "--modes", "compiled"]),
    ("mfu:llama_3b", 200, [*MFU, "--only", "llama_3b,llama_3b_fp8,llama_3b_fp8_rowwise", "--modes", "compiled"]),
    ("mfu:offload", 240, ["benchmarks/gpu_mfu.py", "--steps", "6", "--log-every", "2", "--warmup", "2",
                          "--only", "llama_4b_offload", "--modes", "compiled"]),
    ("mfu:llama_3d_shared", 90, [*MFU, "--only", "llama_3d_shared", "--modes", "eager"]),
    ("mfu:eager", 150, [*MFU, "--only", "gpt2_124m,moe_dropless,moe_capacity,llama_1b", "--modes", "eager"]),
]


# The tests that take longest first, so the workers end together: (a part of) their ids
LONGEST = ("megatron", "moe_bf16", "mfu_is_reported", "compiled", "llamapp_dp2_pp2_tp2", "never_waits")


def _record(row: dict) -> None:
    with open(os.environ["GPU_TESTS_RECORD"], "a") as f:
        f.write(json.dumps(row) + "\n")


# pytest hooks: this file is loaded with -p gpu_routine in the tests part (GPU_TESTS_RECORD set)
def pytest_collection_modifyitems(items):
    if os.environ.get("GPU_TESTS_RECORD"):
        items.sort(key=lambda item: next((i for i, s in enumerate(LONGEST) if s in item.nodeid), len(LONGEST)))


def pytest_collection_finish(session):
    """The tests to run, recorded once (by the first xdist worker, or pytest alone)."""
    if os.environ.get("GPU_TESTS_RECORD") and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        _record({"collected": [item.nodeid for item in session.items]})


def pytest_runtest_logreport(report):
    """Each test's outcome, seconds and one-line reason, recorded as it ends (a part
    killed at its limit keeps the outcomes so far), by the xdist controller only."""
    if not os.environ.get("GPU_TESTS_RECORD") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when != "call" and report.passed:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        why = report.longrepr[2].removeprefix("Skipped: ")
    elif crash is not None:
        why = crash.message
    else:
        why = (str(report.longrepr or "").strip().splitlines() or [""])[-1]
    _record({"test": report.nodeid, "outcome": report.outcome, "when": report.when, "s": round(report.duration, 1),
             "why": one_line(why)})


def one_line(message: str) -> str:
    """A failure's message in a line: its first line and, where the message goes on, the
    last that is not pytest's rewriting of the assert (the error a script's stderr ends
    with, the tensor's greatest difference)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    rest = [line for line in lines[1:] if not line.startswith(("assert ", "+", "-", "where ", "At index", "Full diff"))]
    return " … ".join(lines[:1] + rest[-1:])[:300]


def probe_setup(wheels: Path, site: Path) -> tuple[dict, str | None]:
    """({python, torch, cuda, card, ...}, why nothing can run or None), installing what
    dslc needs from `wheels` into `site` where this interpreter lacks it."""
    info = {"python": f"{sys.executable} {sys.version.split()[0]}"}
    try:
        import torch
    except ImportError:
        return info, f"{sys.executable} has no torch: run make gpu with a python3 that holds torch with CUDA"
    info |= {"torch": torch.__version__, "cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        return info, f"no CUDA device visible to torch {torch.__version__} ({sys.executable}): nothing run"
    info |= {"card": torch.cuda.get_device_name(), "cards": torch.cuda.device_count(),
             "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
             "capability": ".".join(map(str, torch.cuda.get_device_capability())), "smi": smi()}
    why, info["installed"] = install_missing(wheels, site)
    info["missing_optional"] = [m for m in OPTIONAL if importlib.util.find_spec(m) is None]
    return info, why


def smi() -> str:
    """nvidia-smi's power limit, top SM clock and driver (the README names the card by them)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.max.sm,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"
    return (out.stdout.strip().splitlines() or ["?"])[0] if out.returncode == 0 else "nvidia-smi failed"


def install_missing(wheels: Path, site: Path) -> tuple[str | None, list[str]]:
    """(why dslc cannot run or None, the wheels installed): the wheels in `wheels` go into
    `site` (put first on sys.path, and on the parts' PYTHONPATH) when a module of
    REQUIRED or OPTIONAL is missing; the network is never asked."""
    missing = [m for m in REQUIRED + OPTIONAL if importlib.util.find_spec(m) is None]
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    installed = []
    if missing and found:
        out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                              "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, found)],
                             capture_output=True, text=True)
        if out.returncode:
            return f"pip could not install {wheels}: {(out.stderr.strip().splitlines() or ['?'])[-1]}", []
        installed = [w.name.split("-")[0] for w in found]
    if site.is_dir():
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    lacking = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if lacking:
        return (f"{sys.executable} lacks {', '.join(lacking)} (dslc's and its tests' imports) and {wheels} has no"
                " wheel for them: run `make gpu-wheels` where pip reaches PyPI and bring build/gpu-wheels here"), installed
    out = subprocess.run([sys.executable, "-c", "import dslc.codegen, dslc.cli"], capture_output=True, text=True,
                         cwd=ROOT, env=part_env(site))
    if out.returncode:
        return f"dslc does not import: {(out.stderr.strip().splitlines() or ['?'])[-1]}", installed
    return None, installed


def part_env(site: Path) -> dict:
    """The parts' environment: dslc from this checkout, the installed wheels, unbuffered."""
    paths = [str(ROOT), *([str(site)] if site.is_dir() else [])]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")


def process_tree(pid: int) -> list[int]:
    """pid and every process descended from it (from /proc): torchrun starts each rank
    in a session of its own, so killing the part's process group would leave them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def kill_tree(pid: int) -> None:
    """Stop pid's whole tree (stopped, none can start another), then kill it."""
    stopped: set[int] = set()
    while new := set(process_tree(pid)) - stopped:
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        stopped |= new
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def run_limited(cmd: list[str], limit: float, log: Path, env: dict) -> tuple[int | None, float]:
    """(exit status, None if killed at `limit`; seconds): `cmd` with its output appended
    to `log`; past the limit it and every process it started are killed."""
    start = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}   (limit {limit:.0f} s)\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            code = None
            f.write(f"\n(killed at the part's limit of {limit:.0f} s)\n")
        with contextlib.suppress(ProcessLookupError):  # what it left in its group
            os.killpg(proc.pid, signal.SIGKILL)
    return code, time.monotonic() - start


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def tests_part(limit: float, out: Path, scratch: Path, env: dict) -> dict:
    record = scratch / "tests.jsonl"
    n = int(os.environ.get("GPU_TEST_WORKERS", "6"))  # the card holds them; 16 cores compile for them
    workers = ["-n", str(n), "--dist", "load"] if n and importlib.util.find_spec("xdist") else ["-p", "no:xdist"]
    cmd = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "gpu_routine", "-p", "no:cacheprovider", *workers,
           "--basetemp", str(scratch / "pytest"), "tests/test_gpu.py"]
    # this file is pytest's plugin (-p gpu_routine): its folder last, shadowing nothing
    # not an xdist worker's identity inherited from a pytest that runs the routine (the
    # hooks above would take the inner pytest for a worker and record nothing)
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_XDIST")}
    env |= {"GPU_TESTS_RECORD": str(record), "PYTHONPATH": env["PYTHONPATH"] + os.pathsep + str(ROOT / "benchmarks")}
    if n:  # inductor's compile workers: the cores shared among the test workers, not 16 each
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    code, seconds = run_limited(cmd, limit, out / "tests.log", env)
    lines = read_lines(record)
    collected = next((t["collected"] for t in lines if "collected" in t), [])
    worst: dict[str, dict] = {}  # a test's first failure (its call's, or a fixture's), else its outcome
    for t in (t for t in lines if "test" in t):
        if t["test"] not in worst or (t["outcome"] == "failed" and worst[t["test"]]["outcome"] != "failed"):
            worst[t["test"]] = t
    tests = list(worst.values())
    count = {}
    for t in tests:
        count[t["outcome"]] = count.get(t["outcome"], 0) + 1
    ended = set(worst)
    tests += [{"test": name, "outcome": "did not end", "when": "", "s": "", "why": ""} for name in collected
              if name not in ended]
    note = ", ".join(f"{n} {k}" for k, n in sorted(count.items())) or "no test ended"
    note += f" of {len(collected)}"
    if code is None:
        return {"result": "failed", "seconds": seconds, "tests": tests,
                "note": f"killed at its {limit:.0f} s limit; {note} ({len(collected) - len(ended)} did not end)"}
    return {"result": "passed" if code == 0 else "failed", "seconds": seconds,
            "note": note + ("" if code in (0, 1) else f" (pytest exit {code})"), "tests": tests}


def mfu_part(name: str, args: list[str], limit: float, out: Path, scratch: Path, env: dict) -> dict:
    rows_file, log = scratch / f"{name.replace(':', '-')}.jsonl", out / "mfu.log"
    before = log.stat().st_size if log.exists() else 0
    code, seconds = run_limited([sys.executable, *args, "--json", str(rows_file)], limit, log, env)
    with open(log, "rb") as f:  # this part's output: its last line says why where no row came
        f.seek(before)
        said = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    rows = read_lines(rows_file)
    measured = [r for r in rows if "ms" in r]
    failed = [f"{r['case']} {r['run']}: {r['error']}" for r in rows if "error" in r]
    skips = [f"{r['case']} skipped: {r['skipped']}" for r in rows if "skipped" in r]
    notes = [f"{len(measured)} row{'s' * (len(measured) != 1)} measured", *failed, *skips]
    if not rows and said:
        notes.append(said[-1][:300])
    if code is None:
        return {"result": "failed", "seconds": seconds, "rows": rows,
                "note": f"killed at its {limit:.0f} s limit; " + "; ".join(notes)}
    if code or failed:
        result = "failed"
    else:
        result = "passed" if measured else "skipped"
    exit_note = [f"exit {code}: see mfu.log"] if code else []
    return {"result": result, "seconds": seconds, "rows": rows, "note": "; ".join(notes + exit_note)}


def routine(out: Path, budget: float, chosen: list[str], wheels: Path, site: Path, save=None) -> tuple[dict, str | None]:
    """The results ({info, parts}) and why nothing ran (None if the parts ran); save(results)
    after each part, so a routine cut short still leaves its file."""
    start = time.monotonic()
    info, why = probe_setup(wheels, site)
    parts = [{"part": "setup", "result": "failed" if why else "passed", "seconds": time.monotonic() - start,
              "note": why or f"{info['python']}; wheels installed: {', '.join(info['installed']) or 'none'}"
              + (f"; lacking {', '.join(info['missing_optional'])}" if info["missing_optional"] else "")}]
    results = {"info": info, "budget_s": budget, "seconds": 0.0, "parts": parts}
    env = part_env(site)
    with tempfile.TemporaryDirectory() as tmp:
        for name, limit, args in PARTS:
            left = budget - (time.monotonic() - start)
            if why or name not in chosen or left < MIN_START_S:
                reason = why or ("not chosen (GPU_PARTS)" if name not in chosen
                                 else f"{left:.0f} s of the {budget:.0f} s budget left")
                parts.append({"part": name, "result": "skipped", "seconds": 0.0, "limit": limit, "note": reason})
                continue
            if save:  # the parts to come as not run, should this one be the last
                save(results | {"seconds": time.monotonic() - start, "parts": [
                    *parts, *({"part": n, "result": "did not end" if n == name else "not run", "seconds": 0.0,
                               "note": "the routine was stopped"} for n, _, _ in PARTS[len(parts) - 1:])]})
            limit = min(limit, left)
            got = (tests_part(limit, out, Path(tmp), env) if args is None
                   else mfu_part(name, args, limit, out, Path(tmp), env))
            parts.append({"part": name, "limit": round(limit), **got})
            print(f"gpu: {name} {got['result']} in {got['seconds']:.0f} s: {got['note'][:200]}", flush=True)
    return results | {"seconds": time.monotonic() - start}, why


def cell(text: str) -> str:
    """text as one cell of a Markdown table."""
    return " ".join(str(text).split()).replace("|", "/")


def markdown(results: dict) -> str:
    """gpu-results.md: the run's facts, each part, the failed tests, the benchmark's rows."""
    info = results["info"]
    card = info.get("card", "no GPU")
    lines = [f"# make gpu: {card}", "",
             f"torch {info.get('torch', '-')} (CUDA {info.get('cuda') or '-'}), {info['python']}; "
             f"{info.get('cards', 0)} GPU(s), {info.get('memory_gib', '-')} GiB, compute capability "
             f"{info.get('capability', '-')}, nvidia-smi (power limit, max SM clock, driver): {info.get('smi', '-')}; "
             f"{results['date']}, commit {results['commit']}; "
             f"{results['seconds']:.0f} s of a {results['budget_s']:.0f} s budget", "",
             "| part | result | seconds | limit s | note |", "|---|---|---|---|---|"]
    for p in results["parts"]:
        lines.append(f"| {p['part']} | {p['result']} | {p['seconds']:.1f} | {p.get('limit', '')} | {cell(p['note'])} |")
    tests = [t for p in results["parts"] for t in p.get("tests", [])]
    if tests:
        lines += ["", "## tests/test_gpu.py", "", "| test | outcome | seconds | why |", "|---|---|---|---|"]
        for t in sorted(tests, key=lambda t: (t["outcome"] == "passed", t["outcome"] == "skipped", t["test"])):
            lines.append(f"| {t['test'].split('::')[-1]} | {t['outcome']} ({t['when']}) | {t['s']} | "
                         f"{cell(t['why'])} |")
    rows = [r for p in results["parts"] for r in p.get("rows", [])]
    if rows:
        lines += ["", "## benchmarks/gpu_mfu.py", "",
                  "| case | run | ms/step (min-max) | tok/s | MFU | peak GiB | explain: ms, MFU, GiB | ms/explain |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "ms" in r:
                e = r["explain"]
                lines.append(f"| {r['case']} | {r['run']} | {r['ms']:.2f} ({r['low']:.2f}-{r['high']:.2f}) | "
                             f"{r['tok_s']:,.0f} | {r['mfu']:.1%} | {r['gib']:.2f} | {e['ms']:.1f}, {e['mfu']:.1%}, "
                             f"{e['gib']:.1f} | {r['ms'] / e['ms']:.2f} |")
            elif "error" in r or "skipped" in r:
                what = f"failed: {r['error']}" if "error" in r else f"skipped: {r['skipped']}"
                lines.append(f"| {r['case']} | {r.get('run', '')} | {cell(what)} | | | | | |")
        lines += [""] + [f"- {r['case']}: {r['ratio']} = {r['value']:.2f} (target {r['target']})"
                         for r in rows if "ratio" in r]
        for r in rows:
            if "profile" in r:
                lines += ["", f"### profile: {r['case']}, {r['profile']}", "", "```", *r["lines"], "```"]
    return "\n".join(lines) + "\n"


def commit() -> str:
    """HEAD, and whether the tree differs from it: a device machine gets a copy of the
    working tree whose .git may be older than its files (seen: HEAD of the session's start)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    if not head.stdout.strip():
        return "unknown (no .git)"
    return head.stdout.strip() + (" with the tree's files changed since" if dirty.stdout.strip() else "")


def main() -> int:
    out = Path(os.environ.get("GPU_OUT") or os.environ.get("OUT") or ROOT / "build" / "gpu")
    out.mkdir(parents=True, exist_ok=True)
    for log in ("tests.log", "mfu.log"):
        (out / log).unlink(missing_ok=True)
    budget = float(os.environ.get("GPU_BUDGET_S", BUDGET_S))
    chosen = os.environ.get("GPU_PARTS", "").split(",") if os.environ.get("GPU_PARTS") else [p[0] for p in PARTS]
    unknown = sorted(set(chosen) - {p[0] for p in PARTS})
    if unknown:
        print(f"gpu: no part {', '.join(unknown)} (the parts: {', '.join(p[0] for p in PARTS)})", file=sys.stderr)
        return 2
    wheels = Path(os.environ.get("GPU_WHEELS") or ROOT / "build" / "gpu-wheels")
    stamp = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit()}

    def save(results: dict) -> None:
        (out / "gpu-results.json").write_text(json.dumps(results | stamp, indent=1) + "\n")
        (out / "gpu-results.md").write_text(markdown(results | stamp))

    results, why = routine(out, budget, chosen, wheels, ROOT / "build" / "gpu-site", save)
    save(results)
    if why:
        print(f"gpu: {why}; {out / 'gpu-results.md'} marks every part skipped", file=sys.stderr)
        return 1
    failed = [p["part"] for p in results["parts"] if p["result"] == "failed"]
    counts = {k: sum(p["result"] == k for p in results["parts"]) for k in ("passed", "failed", "skipped")}
    print(f"gpu: {', '.join(f'{n} {k}' for k, n in counts.items())} in {results['seconds']:.0f} s"
          f"{' (failed: ' + ', '.join(failed) + ')' if failed else ''}; results in {out / 'gpu-results.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
