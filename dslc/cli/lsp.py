"""``dslc lsp``: the language server (:mod:`dslc.lsp`) on standard input and output."""

from __future__ import annotations


def run(args) -> int:
    """The language server, on standard input and output, until the editor says exit."""
    from ..lsp.server import serve

    serve()
    return 0
