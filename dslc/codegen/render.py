"""Rendering and writing: view model → Jinja → black → ``generated/<plan>/``.

:func:`render` (plan → ``{relative path: text}``), :func:`write` (atomic: a temporary
directory renamed into place, so a failure leaves the previous output intact) and
:func:`stale` (for ``dslc compile --check``). Pipeline plans also get
``schedule.json``, the action lists the script executes (its hash is in the script).
"""

from __future__ import annotations

import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import black
import jinja2

from ..ir import Plan
from ..resources import resource_dir
from .errors import CodegenError
from .view import DEFAULT_ROOT, view_model

TEMPLATES = ("train.py", "launch.sh")
SCHEDULE_FILE = "schedule.json"


def render(plan: Plan, root: Path = DEFAULT_ROOT) -> dict[str, str]:
    """The files of ``plan``'s output directory ``root/<plan>/``, by relative path.

    ``root`` only matters for the paths written into the files (the data file,
    relative to the generated script, and the stamp's regenerate command)."""
    view = view_model(plan, Path(root))
    env = _environment()
    out = {}
    for name in TEMPLATES:
        text = env.get_template(f"{name}.jinja").render(**view)
        out[name] = _format_python(text, name) if name.endswith(".py") else text
    if view["schedule_json"] is not None:
        out[SCHEDULE_FILE] = view["schedule_json"]
    return out


def write(plan: Plan, root: Path = DEFAULT_ROOT) -> Path:
    """Render ``plan`` and replace ``root/<plan>/`` with the result, atomically."""
    files = render(plan, root)  # a plan that cannot be rendered touches nothing
    root = Path(root)
    target = root / plan.name
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{plan.name}.", dir=root))
    except OSError as e:
        raise CodegenError(f"cannot write to {root}: {e.strerror or e}") from None
    old = None
    try:
        for name, text in files.items():
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755 if name.endswith(".sh") else 0o644)
        tmp.chmod(0o755)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{plan.name}.old.", dir=root))
            target.rename(old / plan.name)
        tmp.rename(target)
    except OSError as e:
        if old is not None and not target.exists():
            (old / plan.name).rename(target)  # put the previous output back
        shutil.rmtree(tmp, ignore_errors=True)
        raise CodegenError(f"cannot write {target}: {e.strerror or e}") from None
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def stale(plan: Plan, root: Path = DEFAULT_ROOT) -> list[str]:
    """Paths under ``root/<plan>/`` that are missing or differ from a fresh render."""
    target = Path(root) / plan.name
    out = []
    for name, text in render(plan, root).items():
        path = target / name
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            out.append(str(path))
    return out


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def templates_dir() -> Path:
    """``templates/`` next to the package (a checkout) or inside it (a wheel)."""
    try:
        return resource_dir("templates")
    except FileNotFoundError as e:
        raise CodegenError(str(e)) from None


def _format_python(text: str, name: str) -> str:
    try:
        return black.format_str(text, mode=black.Mode())
    except black.InvalidInput as e:  # a template bug, not a plan error
        raise CodegenError(f"internal error: generated {name} is not valid Python: {e}") from None
