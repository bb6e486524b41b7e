"""Runs several generated programs of one world size, one after another, in each process
of one job: what conftest's ``trained`` uses to train many small plans without starting a
job (and importing torch in every process) for each.

    torchrun --nproc-per-node N run_programs.py JOBS.json   # or forked as torchrun would (conftest)

JOBS.json holds "jobs", a list of ``[folder, [arguments]]``, and "modules", the names of
a generated program's modules (dslc.codegen.package.MODULES). For each job, every rank
imports the folder's modules afresh, runs its train.py as ``__main__`` with those
arguments, and writes what it printed to ``folder/rank<R>.log`` and its exit status to
``folder/rank<R>.status``.
Each program's process group lives under its own store prefix: the program is told it
is attempt k of a job that torchrun restarted (TORCHELASTIC_RESTART_COUNT = k), the path
its start-up takes after a restart, so no key of an earlier program is read. The first
program that fails ends the job (torchrun then stops every rank): the rest have no
status, and the caller runs them again on their own.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import runpy
import sys
import traceback


def run(folder: str, args: list[str], attempt: int, package: list[str]) -> int:
    script = os.path.join(folder, "train.py")
    sys.path.insert(0, folder)
    sys.argv = [script, *args]
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.path.remove(folder)
        for name in package:  # its modules, so that the collection below frees them too
            sys.modules.pop(name, None)
        gc.collect()  # the program's model and optimizer, before the next one's
        gc.freeze()  # what is left (torch, imported once) is not scanned again: the next collect is quick


def main() -> None:
    rank = os.environ["RANK"]
    with open(sys.argv[1]) as f:
        listing = json.load(f)
    jobs, package = listing["jobs"], listing["modules"]
    first = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for k, (folder, args) in enumerate(jobs):
        log = os.path.join(folder, f"rank{rank}.log")
        with open(log, "w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            status = run(folder, args, first + k, package)
        with open(os.path.join(folder, f"rank{rank}.status"), "w") as f:
            f.write(str(status))
        if status:
            sys.stdout.flush()
            os._exit(status)


if __name__ == "__main__":
    main()
