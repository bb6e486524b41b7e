"""Rendering: view model → Jinja → imports → black → ``{relative path: text}``.

:func:`render` gives the files of a plan's output folder: the modules of the generated
package that the plan needs (the view's ``package``, each from ``templates/<file>.jinja``),
``launch.sh`` with the cluster launchers beside it (``sbatch.sh`` for Slurm,
``trainjob.yaml`` for Kubernetes), ``README.md`` (which file holds what), and for pipelines ``schedule.json``,
the action lists the program executes (its hash is in the program). Each module gets its
stamp and then its imports from :mod:`.link`; which files a plan has is :mod:`.package`.
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
from .link import link
from .package import MODULES, SHARED
from .view import DEFAULT_ROOT, view_model

SCHEDULE_FILE = "schedule.json"
LAUNCHER = "launch.sh"
# beside it, the clusters' launchers: Slurm's batch script (which runs launch.sh on each
# node) and a Kubeflow Trainer TrainJob (dslc.codegen.launchers says what they hold)
CLUSTER_LAUNCHERS = ("sbatch.sh", "trainjob.yaml")
README = "README.md"  # the folder's guide: how to run it, which file holds what


def render(plan: Plan, root: Path = DEFAULT_ROOT, layout: bool = True) -> dict[str, str]:
    """The files of ``plan``'s output directory ``root/<plan>/``, by relative path.

    ``root`` only matters for the paths written into the files (the data file,
    relative to the generated script, and the stamp's regenerate command). ``layout=False``
    leaves the modules as the templates render them, not laid out by black (the same code:
    for a program compiled to be run, never read, as ``dslc verify`` runs its plans)."""
    view = view_model(plan, Path(root))
    env = _environment()
    stamp = env.get_template("macros.jinja").module.stamp
    names = ["train.py"] + [name for name, _ in view["package"] if name in MODULES]
    bodies = {name[:-3]: env.get_template(f"{name}.jinja").render(**view) for name in names}
    out = {}
    for module, text in link(bodies).items():
        name = f"{module}.py"
        head = stamp(view["plan_file"], view["plan_name"], view["regenerate"], shared=name in SHARED)
        out[name] = str(head) + (_format_python(text, name) if layout else text)  # the stamp: comments, as they are
    for name in (LAUNCHER, *CLUSTER_LAUNCHERS):
        out[name] = env.get_template(f"{name}.jinja").render(**view)
    out[README] = env.get_template(f"{README}.jinja").render(**view)
    if view["schedule_json"] is not None:
        out[SCHEDULE_FILE] = view["schedule_json"]
    return out


def shared_stamp() -> str:
    """The stamp of a module in :data:`.package.SHARED`; its first two lines open every module."""
    return str(_environment().get_template("macros.jinja").module.stamp("", "", "", shared=True))


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


@lru_cache(maxsize=512)
def _format_python(text: str, name: str) -> str:
    """black's layout of a module. Many modules come out the same in many plans (the stamp
    aside, which is left out), so a run that compiles many plans formats each text once."""
    try:
        return black.format_str(text, mode=black.Mode())
    except black.InvalidInput as e:  # a template bug, not a plan error
        raise CodegenError(f"internal error: generated {name} is not valid Python: {e}") from None
