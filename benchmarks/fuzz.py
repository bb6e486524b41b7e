"""The fuzz campaign: what a stranger may hand dslc, mutated at scale, through every
surface that reads it, with no traceback, no hang and bounded memory (issue 50).

    .venv/bin/python benchmarks/fuzz.py                      # the README's campaign
    .venv/bin/python benchmarks/fuzz.py plans --cases 2000   # one target, fewer cases
    .venv/bin/python benchmarks/fuzz.py plans --replay 1234  # case 1234 alone, shown

Targets (each case is drawn from its own seed, the campaign's seed and its number, so a
failure is replayed alone, on any machine):

- ``plans``: the example plans, the clusters, tests/cases' plans and the published ones,
  mutated one to six times (spans deleted, duplicated or spliced from another plan, words
  of the language and hostile values inserted, numbers set to extremes, imports of
  FIFOs, devices, secrets and itself, lines repeated thousands of times, bytes flipped),
  written to a file and run through ``dslc lint``, ``dslc fmt`` (which rewrites it; then
  ``fmt --check`` must find it formatted and lint must exit as it did before) and
  ``dslc explain``, in this process, as the command line runs them.
- ``checkpoints``: a dp2 x tp2 run's checkpoint, mutated as tests/test_checkpoint.py's
  fuzz test mutates it (bytes flipped, files cut, fields of the manifest and the commit
  marker set to hostile values with the digest rewritten or not, files swapped for FIFOs,
  folders and links out), loaded by the generated script's own ``Checkpoints.load`` in
  a serial plan: it either loads exactly the untouched checkpoint's state (every
  tensor first set to a sentinel, so a hole shows) or stops with one line.
- ``hf``: a Hugging Face folder that ``--export-hf`` wrote in small shards, mutated as
  tests/test_hf.py's fuzz test mutates it, read by the script's ``HFCheckpoint`` and
  ``init_weights``: the untouched weights (a flipped data byte: all but its elements)
  or one line.
- ``lsp``: JSON-RPC messages of every method the server has (and some it has not), with
  fields set to hostile values, documents opened with mutated plans and URIs of FIFOs,
  devices and kernel files, sent to ``dslc lsp`` over stdio: every request answered
  within the limit, every notification followed by a request that is, the server alive.

A traceback is an exception that reaches the harness, an exit status 3 or "internal
error" (dslc), a line on stderr that is not ``train.py: error: ...`` alone (the
script), or a server that dies or logs an internal error; a hang is a case past
``LIMIT`` seconds (a SIGALRM, which Python takes between bytecodes: a loop that never
left C code would stall its worker, and the campaign, rather than count). Memory is each worker's peak resident set; the campaign fails above
``MEMORY_BOUND``. The fixed-size samples in tests/test_fuzz.py run these targets in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
import json
import multiprocessing
import os
import random
import re
import resource
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # dslc, and the tests' mutators and client

LIMIT = 30.0  # seconds a case may take before it counts as a hang (lint's worst plan: 2 s)
MEMORY_BOUND = 2 * 2**30  # bytes of resident memory a worker may reach (torch is ~0.5 GiB)
CASES = {"plans": 100_000, "checkpoints": 10_000, "hf": 10_000, "lsp": 10_000}
SEED = 50


class Hang(BaseException):
    """A case ran past LIMIT (a BaseException: no ``except Exception`` of dslc's or the
    script's catches it)."""


@dataclass
class Tally:
    """What a batch of cases came to: outcomes by name, failures by case number."""

    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: dict = field(default_factory=dict)  # case -> (kind, what)
    slowest: tuple = (0.0, -1)  # seconds, case
    peak_rss: int = 0  # bytes

    def add(self, other: Tally) -> None:
        self.cases += other.cases
        self.outcomes.update(other.outcomes)
        self.failures.update(other.failures)
        self.slowest = max(self.slowest, other.slowest)
        self.peak_rss = max(self.peak_rss, other.peak_rss)


def rng_of(case: int, seed: int = SEED) -> random.Random:
    return random.Random(f"{seed}:{case}")


@contextlib.contextmanager
def limited(seconds: float = LIMIT):
    """Raises Hang in the block once ``seconds`` have passed."""
    def ring(*_):
        raise Hang()
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------
# plans

WORDS = ["plan", "model", "cluster", "mesh", "link", "import", "train", "pipeline", "experts", "optimizer", "adamw",
         "checkpoint", "eval", "data_parallel", "tensor_parallel", "context_parallel", "lr_schedule", "{", "}", "=",
         ";", "on", "(", ")", "[", "]", ",", "tp", "dp", "pp", "cp", "ep", "llama", "gpt2", "mixtral", "nvlink", "ib",
         "1f1b", "zb_v", "dualpipe_v", "interleaved", "text", "tokens", "hf", "synthetic", "true", "false", "\n", "//c\n",
         "#c\n", "/*", "*/", "é", "\t", "\r", "\f", "\u202e", "\ud800", "\x00"]
NUMBERS = ["0", "-1", "1", "2", "3", "4", "7", "8", "16", "64", "1e308", "1e-308", "1e999", "9223372036854775808",
           "18446744073709551617", "262145", "65537", "4096", "0.5", "-0.0", "1_000_000"]
VALUES = NUMBERS + ["nan", "inf", '""', '"' + "a" * 5000 + '"', '"\\u202e"', '"\\u0000"',
          '"/dev/zero"', '"../../../../etc/passwd"', "true", "[]", "{}", "(1, 2)", "(0.9, 0.95, 0.999)", "1 TB/s",
          "0 GB/s", "-5 us", "80 GiB", "1e30 TFLOP/s", "a" * 300]
IMPORTS = ["/dev/zero", "/dev/stdin", "/etc/passwd", "/proc/self/environ", "fifo", "folder", "secret_link", "SELF",
           "../clusters/h100.plan", "../clusters/cpu.plan", "../" * 40 + "x.plan", "nul\\u0000", ""]
NUMBER = re.compile(r"(?<![\w.])\d[\d_.]*(?:e-?\d+)?")
WORD = re.compile(r"[A-Za-z_]\w*")
SEED_FOLDERS = ["plans", "clusters", "tests/cases", "tests/cases/_imports", "benchmarks/published"]


def seed_plans() -> list[tuple[str, str]]:
    """(folder under ROOT, text) of every plan the mutations start from."""
    return [(folder, p.read_text(encoding="utf-8", errors="surrogateescape")) for folder in SEED_FOLDERS
            for p in sorted((ROOT / folder).glob("*.plan"))]


def keys() -> list[str]:
    from dslc.front.keys import KEYS
    return sorted({k for ks in KEYS.values() for k in ks})


def mutate_plan(rng: random.Random, text: str, seeds: list[tuple[str, str]], names: list[str]) -> str:
    """``text`` changed one to six times (see the module's docstring); two cases in five
    only have numbers set to other numbers (most of them still parse: explain's cases)."""
    gentle = rng.random() < 0.4
    for _ in range(rng.choice([1, 1, 1, 2, 3, 6])):
        op = "number" if gentle else rng.choice(["delete", "word", "value", "key", "duplicate", "splice", "import", "repeat", "bytes"])
        i = rng.randrange(len(text) + 1)
        if op == "delete":
            text = text[:i] + text[i + rng.randint(1, 60):]
        elif op == "word":
            text = text[:i] + rng.choice(["", " "]) + rng.choice(WORDS) + rng.choice(["", " "]) + text[i:]
        elif op in ("value", "number", "key"):
            found = list((WORD if op == "key" else NUMBER).finditer(text))
            if found:
                m = rng.choice(found)
                text = text[:m.start()] + rng.choice({"value": VALUES, "number": NUMBERS, "key": names}[op]) + text[m.end():]
        elif op == "duplicate":
            j = min(len(text), i + rng.randint(1, 400))
            text = text[:j] + text[i:j] * rng.choice([1, 2, 10]) + text[j:]
        elif op == "splice":
            other = rng.choice(seeds)[1]
            a = rng.randrange(len(other) + 1)
            text = text[:i] + other[a:a + rng.randint(1, 400)] + text[i:]
        elif op == "import":
            text = text[:i] + f'\nimport "{rng.choice(IMPORTS)}"\n' + text[i:]
        elif op == "repeat":
            lines = text.split("\n")
            line = rng.choice(lines)
            times = min(rng.choice([10, 1000, 30000]), 6_000_000 // (len(line) + 1))
            text = "\n".join(lines + [line] * times)
        else:
            data = bytearray(text.encode("utf-8", "surrogatepass"))
            for _ in range(rng.randint(1, 8)):
                if data:
                    data[rng.randrange(len(data))] = rng.randrange(256)
            text = data.decode("utf-8", "surrogateescape")
    return text


def plan_case(case: int, seed: int, state: dict) -> str:
    """How one mutated plan ended through lint, fmt and explain; AssertionError
    (what went wrong) when a command misbehaves."""
    from dslc.cli import main

    rng = rng_of(case, seed)
    clean = [s for s in state["seeds"] if s[0] in ("plans", "benchmarks/published")]
    folder, text = rng.choice(clean if rng.random() < 0.5 else state["seeds"])  # half of them from a plan lint passes
    text = mutate_plan(rng, text, state["seeds"], state["names"])
    path = state["work"] / folder / f"fuzz{os.getpid()}.plan"
    text = text.replace('"SELF"', f'"{path.name}"')
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    state["last_input"] = path

    def run(*argv: str) -> int:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*argv, str(path)])
        assert code in (0, 1, 2) and "internal error" not in err.getvalue(), f"dslc {' '.join(argv)}: {code} {err.getvalue()[-400:]}"
        size = len(out.getvalue()) + len(err.getvalue())
        state["largest_output"] = max(state.get("largest_output", 0), size)
        return code

    linted = run("lint", "-q")
    formatted = run("fmt", "-q")
    if formatted == 0:
        assert run("fmt", "--check", "-q") == 0, "fmt: not formatted after fmt"
        assert run("lint", "-q") == linted, "lint: another exit after fmt"
    run("explain", "-q")
    return f"lint {linted}, fmt {formatted}"


def plan_state(work: Path, made: dict) -> dict:
    for folder in ["plans", "clusters", "tests", "benchmarks/published", "data"]:
        shutil.copytree(ROOT / folder, work / folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.expected", "__pycache__", "golden", "fixtures", "*.py"))
    for folder in SEED_FOLDERS:
        here = work / folder
        os.mkfifo(here / "fifo")
        (here / "folder").mkdir()
        (here / "secret").write_text("token=ghp_secret\n")
        (here / "secret_link").symlink_to(here / "secret")
    return {"seeds": seed_plans(), "names": keys() + WORDS[:20], "work": work}


# --------------------------------------------------------------------------
# the generated script's loaders: a checkpoint and a Hugging Face folder


def received_checkpoint(work: Path) -> dict:
    """A serial gpt2 script (its checkpoint folder ck/) and the step-2 checkpoint of a
    dp2 x tp2 run of the same model, written by torchrun."""
    from test_checkpoint import gpt2_plan

    from dslc import codegen

    made = work / "made"
    made.mkdir()
    writer = codegen.write(gpt2_plan(made, "dp2_tp2", Path("ck")), made / "out") / "train.py"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(writer), "--steps", "2"],
                         cwd=made, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    script = codegen.write(gpt2_plan(work, "serial", Path("ck")), work / "out") / "train.py"
    return {"script": script, "pristine": made / "ck" / "step0000002", "argv": ["--steps", "0"]}


def received_hf(work: Path) -> dict:
    """A script whose weights start from hf/, and a folder --export-hf wrote in 10 KB shards."""
    from test_hf import FUZZ_MODEL, compile_plan

    made = work / "made"
    made.mkdir()
    exporter = compile_plan(made, "exporter", FUZZ_MODEL, None)
    run = subprocess.run([sys.executable, str(exporter), "--steps", "0", "--export-hf", str(made / "hf"), "--export-shard-size", "10KB"],
                         cwd=made, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    script = compile_plan(work, "fz", FUZZ_MODEL, "made/hf")  # what its start-up reads; the cases, copies
    return {"script": script, "pristine": made / "hf", "argv": ["--steps", "0"]}


def start_script(state: dict, folder: Path) -> dict:
    """The script's module run to the end of its start-up (its main() not called), in
    ``folder``: its globals, where the loaders are."""
    os.chdir(folder)
    script = state["script"]
    sys.path.insert(0, str(script.parent))
    sys.argv = [str(script), *state["argv"]]
    os.environ.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    import torch
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(io.StringIO()):
        return runpy.run_path(str(script), run_name="fuzz")


def loader_state(work: Path, made: dict, target: str) -> dict:
    """What a worker of the checkpoint or hf target needs: the script started, the
    untouched state it loads, a folder outside that links point into."""
    folder = Path(tempfile.mkdtemp(dir=work))
    outside = folder / "outside"
    shutil.copytree(made["pristine"], outside)
    (outside / "secret").write_text("not a checkpoint's")
    os.mkfifo(outside / "fifo")
    into = folder / ("ck/step0000002" if target == "checkpoints" else "hf")
    shutil.copytree(made["pristine"], into)
    state = {**made, "target": target, "folder": folder, "outside": outside, "into": into}
    state["script_globals"] = start_script(state, folder)
    state["before"] = tree(outside)
    state["want"] = load_into(state)
    assert isinstance(state["want"], dict), f"the untouched folder: {state['want']}"
    return state


def tensors_of(g: dict, target: str) -> dict:
    """Every tensor a load writes into, by name."""
    if target == "hf":
        return dict(g["model"].named_parameters())
    ck = g["checkpoints"]
    out = {f"w{i}": q for i, q in enumerate(ck.opt_params)}
    out |= {f"s{i}.{k}": v for i, q in enumerate(ck.opt_params) for k, v in ck.optimizer.state[q].items() if v.dim()}
    return out | {"step": ck.step_count}


def load_into(state: dict) -> dict | str:
    """The loader run on the folder as it is: the tensors it filled (each set to a sentinel
    first), or what it did instead: "refused in one line", or "found no checkpoint" (the
    step folder is no longer one: the script says so and starts at step 0);
    AssertionError when it did anything else."""
    import torch

    g, target = state["script_globals"], state["target"]
    err = io.StringIO()
    with torch.no_grad():
        for t in tensors_of(g, target).values():
            t.fill_(12345.0)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if target == "hf":
                g["init_weights"](g["model"].named_parameters(), g["HFCheckpoint"](str(state["into"])))
            elif g["checkpoints"].load(g["args"].steps) == 0:
                return "found no checkpoint"
    except SystemExit as e:
        lines = err.getvalue().splitlines()
        assert e.code == 1 and len(lines) == 1 and lines[0].startswith("train.py: error: "), f"exit {e.code}: {err.getvalue()[-600:]}"
        return "refused in one line"
    assert not err.getvalue().strip(), err.getvalue()[-600:]
    return {k: t.detach().clone() for k, t in tensors_of(g, target).items()}


def loader_case(case: int, seed: int, state: dict) -> str:
    from test_checkpoint import mutation
    from test_hf import mutate

    rng, target, into = rng_of(case, seed), state["target"], state["into"]
    if os.path.islink(into) or not into.is_dir():
        into.unlink()
    else:
        shutil.rmtree(into)
    shutil.copytree(state["pristine"], into)
    if target == "hf":
        what, may_change = mutate(rng, into, state["outside"])
    else:
        what, apply = mutation(rng, state["outside"])
        apply(into)
        may_change = 0
    state["last_input"] = what
    got = load_into(state)
    assert tree(state["outside"]) == state["before"], f"{what}: a file outside changed"
    if isinstance(got, str):
        return got
    want = state["want"]
    assert got.keys() == want.keys(), what
    changed = sum(int((~((got[k] == want[k]) | (got[k].isnan() & want[k].isnan()))).sum()) for k in want)
    assert changed <= may_change, f"{what}: {changed} elements loaded differently"
    return "loaded the same"


def tree(folder: Path) -> dict:
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in files + dirs:
            st = os.lstat(os.path.join(root, name))
            out[os.path.join(root, name)] = (st.st_size, st.st_mtime_ns)
    return out


# --------------------------------------------------------------------------
# the language server

HOSTILE_JSON = [-1, 0, 2**31, 2**63, 1e308, None, True, "", "x" * 100_000, [], {}, [[[[[[[[[[[]]]]]]]]]]],
                {"line": -1, "character": -1}, "file:///dev/zero", "file:///dev/stdin", "file:///proc/self/mem",
                "file:///etc/shadow", "untitled:x", "http://example.com/a.plan", "file://" + "/a" * 2000, "\ud800",
                "file:///%00", "file:///tmp/../../../../etc/passwd"]
REQUESTS = ["textDocument/hover", "textDocument/completion", "textDocument/definition", "textDocument/formatting",
            "dslc/unknown", "workspace/symbol", "textDocument/documentSymbol"]
NOTIFICATIONS = ["textDocument/didOpen", "textDocument/didChange", "textDocument/didSave", "textDocument/didClose",
                 "$/cancelRequest", "workspace/didChangeConfiguration", "$/setTrace"]
FRAMES = [b"Content-Length: 1000000000000\r\n\r\n{}", b"Content-Length: -5\r\n\r\n{}", b"Content-Length: x\r\n\r\n{}",
          b"Content-Length: 2\r\n\r\n{not json}", b"X: y\r\n\r\n", b"Content-Length: 4\r\n\r\n\xff\xfe\x00\x01",
          b"\r\n\r\n\r\n", b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n[1,2]", b"Content-Length: 100001\r\n\r\n" + b"[" * 100001]


def lsp_message(rng: random.Random, state: dict) -> tuple[str, dict]:
    """(method, message) of one mutated message."""
    uris = [state["uri"], state["uri"], *(f"file://{state['work']}/{n}" for n in ("fifo", "folder", "secret_link", "big.plan", "missing.plan"))]
    method = rng.choice(REQUESTS * 3 + NOTIFICATIONS)
    text = mutate_plan(rng, rng.choice(state["seeds"])[1], state["seeds"], state["names"])
    position = {"line": rng.choice([0, 1, 5, 30, 10**6]), "character": rng.choice([0, 3, 8, 10**6])}
    params = {"textDocument": {"uri": rng.choice(uris), "version": rng.randint(1, 10**6), "languageId": "dslc", "text": text},
              "position": position, "options": {"tabSize": 4, "insertSpaces": True},
              "contentChanges": [{"text": text}], "query": "plan", "id": 1, "settings": {}, "value": "off"}
    message = {"method": method, "params": params}
    for _ in range(rng.randint(0, 3)):  # a field, or the params, made hostile or dropped
        holder, key = message, "params"  # (the params may be gone: a round before dropped them)
        while (key in holder or isinstance(holder, list)) and isinstance(holder[key], (dict, list)) and holder[key] and rng.random() < 0.7:
            holder = holder[key]
            key = rng.choice(list(holder)) if isinstance(holder, dict) else rng.randrange(len(holder))
        if isinstance(holder, dict) and key in holder and rng.random() < 0.2:
            del holder[key]
        else:
            holder[key] = copy.deepcopy(rng.choice(HOSTILE_JSON))  # its own: a later round may change inside it
    return method, message


def lsp_client(state: dict):
    """A server started and initialized, with a document open; its stderr read by a
    thread into ``client.errors`` (lines with a traceback or an internal error)."""
    import threading

    from test_lsp import Client

    client = Client(state["work"])
    client.errors = []

    def read_stderr():
        for line in client.proc.stderr:
            if b"Traceback" in line or b"internal error" in line:
                client.errors.append(line.decode("utf-8", "replace")[:300])
    threading.Thread(target=read_stderr, daemon=True).start()
    client.request("initialize", {"processId": None, "rootUri": state["work"].as_uri(), "capabilities": {}})
    client.notify("initialized", {})
    client.notify("textDocument/didOpen", {"textDocument": {"uri": state["uri"], "languageId": "dslc", "version": 1,
                                                            "text": state["seeds"][0][1]}})
    return client


def lsp_alive(client, state: dict) -> None:
    r = client.request("textDocument/hover", {"textDocument": {"uri": state["uri"]}, "position": {"line": 0, "character": 0}})
    assert "error" not in r, f"a plain hover got {r}"


def lsp_case(case: int, seed: int, state: dict) -> str:
    rng = rng_of(case, seed)
    client = state.get("client")
    if client is None or client.proc.poll() is not None:
        client = state["client"] = lsp_client(state)
    if case % 50 == 0:  # framing: a server of its own
        frame = rng.choice(FRAMES)
        state["last_input"] = frame[:80]
        own = lsp_client(state)
        try:
            own.proc.stdin.write(frame)
            own.proc.stdin.flush()
            try:
                lsp_alive(own, state)
                outcome = "bad frame: answered after it"
            except (TimeoutError, BrokenPipeError):
                code = own.proc.poll()
                if code is None:  # neither answered nor gone
                    raise Hang() from None
                assert code in (0, 1), f"exit {code}"
                outcome = "bad frame: ended the stream"
            assert not own.errors, own.errors
            state["peak"] = max(state.get("peak", 0), peak_of(own.proc.pid))
        finally:
            own.proc.kill()
        return outcome
    method, message = lsp_message(rng, state)
    state["last_input"] = json.dumps(message)[:300]
    try:
        if method in REQUESTS:
            client.ids += 1
            client.send({"id": client.ids, **message})
            r = client.wait(lambda m: m.get("id") == client.ids and "method" not in m, LIMIT)
            outcome = "error" if "error" in r else "result"
        else:
            client.send(message)
            outcome = "notification"
        lsp_alive(client, state)
    except TimeoutError:
        raise Hang() from None
    except BrokenPipeError:
        raise AssertionError(f"the server ended ({client.proc.poll()})") from None
    logged = [m for m in client.inbox if m.get("method") == "window/logMessage" and m["params"].get("type") == 1]
    client.inbox.clear()
    assert not logged and not client.errors, (logged or client.errors)[0]
    return f"{method.split('/')[-1]}: {outcome}"


def lsp_state(work: Path, made: dict) -> dict:
    os.mkfifo(work / "fifo")
    (work / "folder").mkdir()
    (work / "secret").write_text("token=ghp_secret\n")
    (work / "secret_link").symlink_to(work / "secret")
    with open(work / "big.plan", "wb") as f:
        f.truncate(300 * 2**20)  # sparse: 300 MB of zeros
    (work / "doc.plan").write_text(seed_plans()[0][1])
    return {"seeds": seed_plans(), "names": keys(), "work": work, "uri": (work / "doc.plan").as_uri()}


# --------------------------------------------------------------------------
# the campaign


# each target's worker state (from its folder and what prepared() made) and its case
TARGETS = {"plans": (plan_state, plan_case), "checkpoints": (functools.partial(loader_state, target="checkpoints"), loader_case),
           "hf": (functools.partial(loader_state, target="hf"), loader_case), "lsp": (lsp_state, lsp_case)}


def prepared(target: str, work: Path) -> dict:
    """What every worker of ``target`` starts from, made once (the loaders' real runs)."""
    if target == "checkpoints":
        return received_checkpoint(work)
    if target == "hf":
        return received_hf(work)
    return {}


def worker(target: str, work: str, made: dict, cases: range, seed: int) -> Tally:
    """Runs ``cases`` in this process (a fresh one: the generated modules are imported here
    only)."""
    work = Path(tempfile.mkdtemp(dir=work))
    start, run = TARGETS[target]
    state = start(work, made)
    tally = Tally()
    for case in cases:
        began = time.perf_counter()
        try:
            with limited():
                outcome = run(case, seed, state)
            tally.outcomes[outcome] += 1
        except Hang:
            tally.failures[case] = ("hang", str(state.get("last_input"))[:300])
            state.pop("client", None)
        except AssertionError as e:
            tally.failures[case] = ("traceback", f"{e}"[:600] + f" | input: {str(state.get('last_input'))[:200]}")
        except Exception as e:  # noqa: BLE001  (what the campaign counts)
            import traceback
            tally.failures[case] = ("traceback", "".join(traceback.format_exception(e))[-1500:])
        tally.cases += 1
        tally.slowest = max(tally.slowest, (time.perf_counter() - began, case))
    tally.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if state.get("client"):  # the servers' peak, not this client's
        tally.peak_rss = max(state.get("peak", 0), peak_of(state["client"].proc.pid))
        state["client"].proc.kill()
    return tally


def peak_of(pid: int) -> int:
    """The peak resident memory of a running process, in bytes (Linux's VmHWM; 0 once it
    has ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)
    except FileNotFoundError:
        return 0


def _worker(args) -> Tally:
    return worker(*args)


def campaign(target: str, cases: int, seed: int = SEED, jobs: int = 2, first: int = 0) -> tuple[Tally, float]:
    """Cases first .. first + cases of ``target``, over ``jobs`` processes: their tally and
    the seconds it took."""
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dslc-fuzz-") as work:
        made = prepared(target, Path(work))
        step = max(1, min(500, cases // (jobs * 4) or 1))
        batches = [(target, work, made, range(a, min(first + cases, a + step)), seed) for a in range(first, first + cases, step)]
        tally = Tally()
        with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=1) as pool:
            for t in pool.imap_unordered(_worker, batches):
                tally.add(t)
    return tally, time.perf_counter() - began


def report(target: str, tally: Tally, seconds: float) -> str:
    kinds = Counter(kind for kind, _ in tally.failures.values())
    slow, case = tally.slowest
    return (f"{target}: {tally.cases} cases in {seconds:.0f} s, {kinds['traceback']} tracebacks, {kinds['hang']} hangs,"
            f" peak {tally.peak_rss / 2**20:.0f} MiB a worker, slowest case {slow:.2f} s (#{case});"
            f" outcomes: {', '.join(f'{n} {k}' for k, n in tally.outcomes.most_common())}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", metavar="TARGET", help=f"of {', '.join(CASES)} (default: all)")
    ap.add_argument("--cases", type=int, help="cases of each target (default: the campaign's)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--replay", type=int, metavar="CASE", help="this case alone, its failure shown whole")
    args = ap.parse_args()
    if set(args.targets) - set(CASES):
        ap.error(f"no target {sorted(set(args.targets) - set(CASES))[0]!r}: {', '.join(CASES)}")
    bad = 0
    for target in args.targets or CASES:
        first, cases = (args.replay, 1) if args.replay is not None else (0, args.cases or CASES[target])
        tally, seconds = campaign(target, cases, args.seed, 1 if args.replay is not None else args.jobs, first)
        print(report(target, tally, seconds), flush=True)
        for case, (kind, what) in sorted(tally.failures.items())[:20]:
            print(f"  #{case} {kind}: {what}")
        bad += len(tally.failures) + (tally.peak_rss > MEMORY_BOUND)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
