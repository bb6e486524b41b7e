"""The protocol's side of ``dslc lsp`` (pygls, over stdio).

Documents are synchronised whole (a plan file is small), and linted:

- when opened or saved at once (on a save every open document again: a saved import
  changes what its importers see);
- while typing once the typing pauses for :data:`DEBOUNCE` seconds: each change cancels
  the lint the previous one scheduled, so a burst of keystrokes is linted once, on its
  last text;
- when closed, its diagnostics are cleared.

Every request is answered from the document's current text; a request about a document
that is neither open nor on disk is answered with nothing. No input, however broken, gets
a traceback back: a request that fails on a bug answers nothing and logs one line
(``window/logMessage``), and what pygls logs on standard error (a message that is not
JSON, parameters of the wrong shape) is one line too, unless ``DSLC_DEBUG`` is set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer

from .. import __version__
from ..front.fmt import FormatError, format_text
from .analysis import Analysis
from .complete import complete
from .definition import definition
from .hover import hover
from .positions import Text

DEBOUNCE = 0.3  # seconds without a change before a document is linted


class PlanServer(LanguageServer):
    def __init__(self):
        super().__init__("dslc", __version__, text_document_sync_kind=lsp.TextDocumentSyncKind.Full)
        self.analyses: dict[str, Analysis] = {}  # of each document's text last analysed
        self.parsed: dict[str, Analysis] = {}  # the last that parsed: the names completion offers
        self.pending: dict[str, asyncio.TimerHandle] = {}

    @property
    def encoding(self) -> str:
        return str(self.workspace.position_encoding or "utf-16")

    def source(self, uri: str) -> str:
        """The document's text; :class:`Unknown` when it is neither open nor a file."""
        try:
            return self.workspace.get_text_document(uri).source
        except (OSError, ValueError):
            raise Unknown(uri) from None

    def analysis(self, uri: str) -> Analysis:
        """The analysis of the document's current text (kept until the text changes)."""
        source = self.source(uri)
        an = self.analyses.get(uri)
        if an is None or an.text.text != source or an.text.encoding != self.encoding:
            an = self.analyses[uri] = Analysis(uri, source, self.encoding)
            if an.tree is not None:
                self.parsed[uri] = an
        return an

    def publish(self, uri: str) -> None:
        self.pending.pop(uri, None)
        if uri not in self.workspace.text_documents:
            return  # closed meanwhile
        try:
            diagnostics = self.analysis(uri).diagnostics()
        except Unknown:
            return
        except Exception as e:  # a bug: say so in one line, keep serving
            self.log(f"cannot lint {uri}: {type(e).__name__}: {e}")
            return
        version = self.workspace.get_text_document(uri).version
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, diagnostics, version))

    def later(self, uri: str) -> None:
        """Lint ``uri`` once no change has come for :data:`DEBOUNCE` seconds."""
        old = self.pending.pop(uri, None)
        if old is not None:
            old.cancel()
        self.pending[uri] = asyncio.get_running_loop().call_later(DEBOUNCE, self.publish, uri)

    def forget(self, uri: str) -> None:
        old = self.pending.pop(uri, None)
        if old is not None:
            old.cancel()
        self.analyses.pop(uri, None)
        self.parsed.pop(uri, None)
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, []))

    def log(self, message: str, kind: lsp.MessageType = lsp.MessageType.Error) -> None:
        self.window_log_message(lsp.LogMessageParams(kind, f"dslc: {message}"))


class Unknown(Exception):
    """A request about a document the server has not been given and cannot read."""


def guarded(fn):
    """A request handler that answers None, and logs one line, where it would raise."""

    @functools.wraps(fn)
    def answer(ls: PlanServer, params):
        try:
            return fn(ls, params)
        except Unknown:
            return None
        except Exception as e:
            ls.log(f"internal error in {fn.__name__}: {type(e).__name__}: {e}")
            return None

    return answer


def build() -> PlanServer:
    server = PlanServer()

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: PlanServer, params: lsp.DidOpenTextDocumentParams):
        ls.publish(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: PlanServer, params: lsp.DidChangeTextDocumentParams):
        ls.later(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: PlanServer, params: lsp.DidSaveTextDocumentParams):
        for uri in list(ls.workspace.text_documents):
            ls.analyses.pop(uri, None)  # its imports may have changed on disk
            ls.publish(uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: PlanServer, params: lsp.DidCloseTextDocumentParams):
        ls.forget(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_HOVER)
    @guarded
    def on_hover(ls: PlanServer, params: lsp.HoverParams):
        an = ls.analysis(params.text_document.uri)
        return hover(an, an.text.offset(params.position))

    @server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
    @guarded
    def on_definition(ls: PlanServer, params: lsp.DefinitionParams):
        an = ls.analysis(params.text_document.uri)
        return definition(an, an.text.offset(params.position))

    @server.feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=[" ", '"', "/"]))
    @guarded
    def on_completion(ls: PlanServer, params: lsp.CompletionParams):
        uri = params.text_document.uri
        text = Text(ls.source(uri), ls.encoding)
        an = ls.parsed.get(uri) or ls.analysis(uri)  # the names the file saw when it last parsed
        caps = ls.client_capabilities.text_document
        snippets = bool(caps and caps.completion and caps.completion.completion_item and caps.completion.completion_item.snippet_support)
        trigger = params.context.trigger_character if params.context else None
        return lsp.CompletionList(False, complete(an, text, text.offset(params.position), snippets, trigger))

    @server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
    @guarded
    def on_formatting(ls: PlanServer, params: lsp.DocumentFormattingParams):
        return formatting(ls, params.text_document.uri)

    return server


def formatting(ls: PlanServer, uri: str) -> list[lsp.TextEdit]:
    """``dslc fmt`` of the document's text: one edit replacing it, none when it is already
    formatted or cannot be (a syntax error; the reason shown to the user)."""
    an = ls.analysis(uri)
    try:
        new = format_text(an.text.text, an.path)
    except FormatError as e:
        ls.window_show_message(lsp.ShowMessageParams(lsp.MessageType.Warning, f"dslc fmt: not formatted: {e}"))
        return []
    if new == an.text.text:
        return []
    return [lsp.TextEdit(lsp.Range(lsp.Position(0, 0), an.text.end()), new)]


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        first = record.getMessage().strip().split("\n")[0]
        return f"dslc lsp: {record.levelname.lower()}: {first}" + (f" ({record.exc_info[1]!r})" if record.exc_info else "")


def serve() -> None:
    """Answer the protocol on standard input and output until the client says exit."""
    if not os.environ.get("DSLC_DEBUG"):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLine())
        logging.basicConfig(level=logging.WARNING, handlers=[handler])
    build().start_io()
