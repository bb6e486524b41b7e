"""Code generation: IR → view model → Jinja → black → ``generated/<plan>/``.

:func:`render` (plan → ``{relative path: text}``), :func:`write` and :func:`stale` (for
``dslc compile --check``); :class:`Unsupported` for a valid plan the generator cannot
compile yet, :class:`CodegenError` for output that cannot be written.
"""

from .render import DEFAULT_ROOT, CodegenError, Unsupported, render, stale, view_model, write

__all__ = ["DEFAULT_ROOT", "CodegenError", "Unsupported", "render", "stale", "view_model", "write"]
