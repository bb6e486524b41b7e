"""Runs generated programs as ``python train.py ARGS`` or ``torchrun --standalone
--nproc-per-node N train.py ARGS`` run them, each process a child forked from this
process, which has imported torch once: the tests run some hundred such programs, and
importing torch (in every rank, and in torchrun itself) is most of what each one costs.

It runs ``python -m dslc ARGS`` too (argv ``["-m", "dslc", ...]``; dslc is imported here
once as well), for the tests that run the CLI as CI runs it, in a child with bounds.

Started by conftest's run_script (``forkserver.py MODULE...``, the names of a generated
program's modules, none of which may be imported here); reads one JSON request a line on
standard input,
{"argv", "env", "cwd", "stdout", "stderr", "timeout", "nproc", "umask"} and optionally
"stdin" (a file to read instead of /dev/null) and "max_bytes" (the child's address space),
and answers each with a
line, {"returncode"} (null after a timeout, when the children were killed). Each child
takes the request's environment, folder and arguments, finds the program's modules first
on the path (as python does for a script), writes its output into files of its own,
appended to the request's two in rank order once all have ended, and exits with the
program's status: an exception is printed with its traceback and exits 1, as the
interpreter would. Several ranks get what torchrun --standalone gives its workers (RANK,
WORLD_SIZE, LOCAL_RANK, a free MASTER_PORT on 127.0.0.1, restart count 0) and what it
does on a failure: the first rank that fails ends the others, and the status is 1. The
process has one thread when it forks (torch starts none on import), so a child inherits
no lock held by another.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import runpy
import signal
import socket
import sys
import time
import traceback

import torch  # noqa: F401  (what every program imports, once for all of them)
import torch._dynamo  # noqa: F401  (what torch.optim's optimizers import when one is built: 1 s a run)
import torch.distributed  # noqa: F401
import torch.distributed.checkpoint  # noqa: F401
import torch.nn.functional  # noqa: F401

import dslc.cli  # noqa: F401  (python -m dslc's start-up: lark, jinja2, networkx, ...)


def child(request: dict) -> None:
    os.chdir(request["cwd"])
    os.umask(request["umask"])  # the test's, as a process it started would inherit
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, request.get("stdin") or os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(path, flags), fd)
    if request.get("max_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (request["max_bytes"], request["max_bytes"]))
    status, argv = 0, list(request["argv"])
    try:
        if argv[0] == "-m":  # python -m MODULE ARGS
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            status = e.code or 0
        else:  # sys.exit("message"), as the interpreter reports it
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(request: dict) -> int | None:
    """Forks the request's ranks and waits for them: the status, or None after the timeout."""
    n, port = request.get("nproc", 1), free_port()
    ranks = {}
    for rank in range(n):
        mine = dict(request, stdout=f"{request['stdout']}.{rank}", stderr=f"{request['stderr']}.{rank}")
        if n > 1:
            mine["env"] = request["env"] | {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
                "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            }
        pid = os.fork()
        if pid == 0:
            child(mine)
        ranks[pid] = rank
    deadline, codes, timed_out = time.monotonic() + request["timeout"], {}, False
    while len(codes) < n:
        pid, code = os.waitpid(-1, os.WNOHANG)
        if pid:
            codes[pid] = os.waitstatus_to_exitcode(code)
            if codes[pid] != 0:
                break  # as torchrun: the first failure ends every rank
        elif time.monotonic() > deadline:
            timed_out = True
            break
        else:
            time.sleep(0.005)
    for pid in ranks.keys() - codes.keys():
        os.kill(pid, signal.SIGKILL)
        codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    for key in ("stdout", "stderr"):
        with open(request[key], "wb") as out:
            for rank in range(n):
                with open(f"{request[key]}.{rank}", "rb") as f:
                    out.write(f.read())
    if timed_out:
        return None
    if n == 1:
        return codes.popitem()[1]
    return 1 if any(codes.values()) else 0


def main() -> None:
    package = set(sys.argv[1:])  # the generated programs' module names: each child imports its own
    assert not package & sys.modules.keys(), package & sys.modules.keys()
    gc.freeze()  # what is imported here is never collected: a child's collections skip it (and its pages stay shared)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()  # nothing of ours for the child to flush into its output
        print(json.dumps({"returncode": run(request)}), flush=True)


if __name__ == "__main__":
    main()
