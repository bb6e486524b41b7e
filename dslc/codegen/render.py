"""Rendering: view model → Jinja → black → ``{relative path: text}``.

:func:`render` gives the files of a plan's output folder; pipeline plans also get
``schedule.json``, the action lists the script executes (its hash is in the script).
Writing them is :mod:`.files`.
"""

from __future__ import annotations

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
