"""Code generation: IR → view model → Jinja → black → ``generated/<plan>/``.

:func:`render` (plan → ``{relative path: text}``), :func:`write` (only the files dslc
owns: :mod:`.files`) and :func:`stale` (for ``dslc compile --check``);
:class:`Unsupported` for a valid plan the generator cannot compile yet,
:class:`CodegenError` for output that cannot be written. The view model
is :mod:`.view`, the pipeline's part and schedule.json :mod:`.pipeline`, number and
name literals :mod:`.literals`.
"""

from .errors import CodegenError, Unsupported
from .files import stale, write
from .render import render
from .view import DEFAULT_ROOT, view_model

__all__ = ["DEFAULT_ROOT", "CodegenError", "Unsupported", "render", "stale", "view_model", "write"]
