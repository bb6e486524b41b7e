"""The protocol's side of ``dslc lsp`` (pygls, over stdio).

Documents are synchronised whole (a plan file is small), and linted:

- when opened or saved at once (on a save every open document again: a saved import
  changes what its importers see);
- while typing once the typing pauses for :data:`DEBOUNCE` seconds: each change cancels
  the lint the previous one scheduled, so a burst of keystrokes is linted once, on its
  last text;
- when closed, its diagnostics are cleared.

Every request is answered from the document's current text. A document the editor has
not opened is read from its ``file:`` path as ``dslc lint`` reads a plan (:mod:`dslc.reading`:
a regular file of at most 4 MiB, never a FIFO or a device), and nothing else is read (pygls
would read any path whole); a request about a document that is neither open nor such a file
is answered with nothing, and one that is not a plan with nothing and one line saying why
(``window/logMessage``). No input, however broken, gets a traceback back: a request that
fails on a bug answers nothing and logs one line, a request pygls cannot read is answered
with InvalidParams (:mod:`.wire`, which also bounds a message's length), and what pygls
logs on standard error (a message that is not JSON, parameters of the wrong shape) is one
line too, unless ``DSLC_DEBUG`` is set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from urllib.parse import unquote

from lsprotocol import types as lsp
from pygls import uris
from pygls.lsp.server import LanguageServer
from pygls.workspace import TextDocument

from .. import __version__
from ..front.fmt import FormatError, format_text
from ..front.load import read_text
from ..reading import NotAFile
from .analysis import Analysis
from .complete import complete
from .definition import definition
from .hover import hover
from .positions import Text
from .wire import Framed, Protocol

DEBOUNCE = 0.3  # seconds without a change before a document is linted


class PlanServer(LanguageServer):
    def __init__(self):
        super().__init__("dslc", __version__, text_document_sync_kind=lsp.TextDocumentSyncKind.Full, protocol_cls=Protocol)
        self.analyses: dict[str, Analysis] = {}  # of each document's text last analysed
        self.parsed: dict[str, Analysis] = {}  # the last that parsed: the names completion offers
        self.pending: dict[str, asyncio.TimerHandle] = {}

    @property
    def encoding(self) -> str:
        return str(self.workspace.position_encoding or "utf-16")

    def opened(self, uri: str) -> TextDocument | None:
        """The document as the editor sent it; None when it has not opened it."""
        return self.workspace.text_documents.get(unquote(uri))

    def source(self, uri: str) -> str:
        """The document's text: the editor's, or its file's as ``dslc lint`` reads a plan
        (pygls's fallback, ``TextDocument.source``, would read any path whole: a FIFO
        blocks, /dev/zero never ends); :class:`Unknown` when it is neither."""
        doc = self.opened(uri)
        if doc is not None:
            return doc.source
        path = uris.to_fs_path(uri)
        if path is None:
            raise Unknown(uri)  # an untitled buffer never opened: nothing to read
        try:
            text, _, problems = read_text(path)
        except FileNotFoundError:
            raise Unknown(uri) from None
        except OSError as e:  # a FIFO, a device, a directory: never opened
            why = f"it is {e.kind}, not a regular file" if isinstance(e, NotAFile) else e.strerror or type(e).__name__
            self.log(f"{path} is not read: {why}", lsp.MessageType.Warning)
            raise Unknown(uri) from None
        if text is None:
            self.log(f"{path} is not read: {problems[0].code}: {problems[0].message}", lsp.MessageType.Warning)
            raise Unknown(uri)
        return text

    def analysis(self, uri: str) -> Analysis:
        """The analysis of the document's current text (kept, for an open document, until
        the text changes)."""
        source = self.source(uri)
        an = self.analyses.get(uri)
        if an is None or an.text.text != source or an.text.encoding != self.encoding:
            an = Analysis(uri, source, self.encoding)
            if self.opened(uri) is not None:  # a file on disk is read again at each request
                self.analyses[uri] = an
                if an.tree is not None:
                    self.parsed[uri] = an
        return an

    def publish(self, uri: str) -> None:
        self.pending.pop(uri, None)
        doc = self.opened(uri)
        if doc is None:
            return  # closed meanwhile
        try:
            diagnostics = self.analysis(uri).diagnostics()
        except Exception as e:  # a bug: say so in one line, keep serving
            self.log(f"cannot lint {uri}: {type(e).__name__}: {e}")
            return
        version = doc.version
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
    build().start_io(Framed(sys.stdin.buffer))
