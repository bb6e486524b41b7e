"""Runs generated programs of one process as ``python train.py ARGS`` runs them, each in a
child forked from this process, which has imported torch once: the tests run some hundred
such programs, and importing torch is most of what each one costs.

Started by conftest's run_script (``forkserver.py MODULE...``, the names of a generated
program's modules, none of which may be imported here); reads one JSON request a line on
standard input,
{"argv", "env", "cwd", "stdout", "stderr", "timeout"}, and answers each with a line,
{"returncode"} (null after a timeout, when the child was killed). The child takes the
request's environment, folder and arguments, finds the program's modules first on the
path (as python does for a script), writes its output into the two files, and exits with
the program's status: an exception is printed with its traceback and exits 1, as the
interpreter would. The process has one thread when it forks (torch starts none on
import), so the child inherits no lock held by another.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback

import torch  # noqa: F401  (what every program imports, once for all of them)
import torch._dynamo  # noqa: F401  (what torch.optim's optimizers import when one is built: 1 s a run)
import torch.distributed  # noqa: F401
import torch.distributed.checkpoint  # noqa: F401
import torch.nn.functional  # noqa: F401


def child(request: dict) -> None:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(path, flags), fd)
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
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


def main() -> None:
    package = set(sys.argv[1:])  # the generated programs' module names: each child imports its own
    assert not package & sys.modules.keys(), package & sys.modules.keys()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()  # nothing of ours for the child to flush into its output
        pid = os.fork()
        if pid == 0:
            child(request)
        deadline, status = time.monotonic() + request["timeout"], None
        while status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(code)
            elif time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            else:
                time.sleep(0.005)
        print(json.dumps({"returncode": status}), flush=True)


if __name__ == "__main__":
    main()
