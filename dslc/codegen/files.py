"""Writing a plan's output folder, ``root/<plan>/``: only the files dslc owns.

The folder is the user's too: checkpoints, loss dumps and notes kept there survive a
recompile. :func:`write` replaces each file of the generated package, the launchers
(``launch.sh``, ``sbatch.sh``, ``trainjob.yaml``) and ``schedule.json`` by a rename (every new file is written first, so a failure leaves the
previous output as it was); it removes a module or schedule.json that it wrote for this
plan earlier and the plan no longer needs, and nothing else; it refuses a folder that
holds plan sources or is a link to somewhere else. :func:`stale` is
``dslc compile --check``: every file that a write would change, add or remove.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..ir import Plan
from ..reading import inside
from .errors import CodegenError
from .package import MODULES
from .render import SCHEDULE_FILE, render, shared_stamp
from .view import DEFAULT_ROOT

NAME_MAX = 255  # bytes in one folder name, on the file systems dslc writes to
MAX_OUTPUT = 16 * 1024 * 1024  # bytes: far above any file dslc writes


def write(plan: Plan, root: Path = DEFAULT_ROOT, sources: Iterable[str] = (), layout: bool = True) -> Path:
    """Render ``plan`` and write its files into ``root/<plan>/``; ``sources`` are the
    plan files read (the output folder may hold none of them); ``layout``: as :func:`render`."""
    files = render(plan, root, layout)  # a plan that cannot be rendered touches nothing
    root = Path(root)
    target = root / plan.name
    _refuse(target, root, sources)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CodegenError(f"cannot write to {root}: {e.strerror or e}") from None
    temps: dict[str, Path] = {}
    try:
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=target)
            os.close(fd)
            temps[name] = Path(tmp)
            temps[name].write_text(text, encoding="utf-8")
            temps[name].chmod(0o755 if name.endswith(".sh") else 0o644)
        for name, tmp in temps.items():
            os.replace(tmp, target / name)  # replaces a link itself, never its target
    except OSError as e:
        raise CodegenError(f"cannot write {target}: {e.strerror or e}") from None
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
    for name in _left_over(target, files, plan.name):
        (target / name).unlink()  # the plan no longer needs it
    return target


def stale(plan: Plan, root: Path = DEFAULT_ROOT) -> list[str]:
    """Paths under ``root/<plan>/`` that are missing or differ from a fresh render, and
    the files dslc wrote there earlier that the plan no longer needs."""
    target = Path(root) / plan.name
    files = render(plan, root)
    out = [str(target / name) for name, text in files.items() if _read(target / name) != text]
    return out + [str(target / name) for name in _left_over(target, files, plan.name)]


def _left_over(target: Path, files: dict[str, str], plan_name: str) -> list[str]:
    """The modules and schedule.json in ``target`` that dslc wrote for this plan and that
    ``files`` (a fresh render) no longer has."""
    gone = [name for name in (*MODULES, SCHEDULE_FILE) if name not in files]
    return [name for name in gone if _wrote(target / name, plan_name)]


def _wrote(path: Path, plan_name: str) -> bool:
    """Whether ``path`` is a file that dslc wrote for this plan: a module with its stamp,
    or a schedule.json of the plan."""
    if path.name == SCHEDULE_FILE:
        return _wrote_schedule(path, plan_name)
    head = (_read(path) or "").splitlines()[:3]
    shared = shared_stamp().splitlines()
    return len(head) == 3 and head[:2] == shared[:2] and (
        head[2] == shared[2] or head[2].startswith(f"# Plan {plan_name} from ")
    )


def _refuse(target: Path, root: Path, sources: Iterable[str]) -> None:
    """A one-line :class:`CodegenError` for an output folder dslc must not write into."""
    if len(os.fsencode(target.name)) > NAME_MAX:
        raise CodegenError(
            f"plan name {target.name[:20]}… is {len(target.name)} characters: the output folder's "
            f"name can have at most {NAME_MAX}; rename the plan"
        )
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        what = "a link" if target.is_symlink() else "not a folder"
        raise CodegenError(f"cannot write {target}: it is {what}; remove it or choose another -o")
    folders = [os.path.realpath(root), os.path.realpath(target)]
    held = [
        s for s in sources
        if os.path.isfile(s) and any(inside(s, f) for f in folders)
    ]
    held += [str(p) for p in (root.glob("*.plan") if root.is_dir() else ())]
    held += [  # links are not followed: a folder of checkpoints is walked once
        os.path.join(d, f) for d, _, names in os.walk(target) for f in names if f.endswith(".plan")
    ]
    if held:
        raise CodegenError(
            f"output folder {root} holds plan sources ({held[0]}); "
            "choose a folder of its own, e.g. -o generated"
        )


def _wrote_schedule(path: Path, plan_name: str) -> bool:
    """Whether ``path`` is a schedule.json that dslc wrote for this plan."""
    try:
        doc = json.loads(_read(path) or "")
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("plan") == plan_name and {"schedule", "actions"} <= doc.keys()


def _read(path: Path) -> str | None:
    """The text of a regular file dslc may have written, or None: a link, a FIFO or a
    file larger than any output is never read (the folder may come from a pull request)."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_OUTPUT:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
