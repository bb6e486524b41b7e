"""What reaches ``dslc lsp`` over standard input, bounded before pygls reads it.

pygls reads a message's headers a line at a time and then as many bytes as its
``Content-Length`` says, whatever that is (``Content-Length: 1000000000000`` was a
MemoryError that ended the server), and a request whose parameters do not fit the
protocol's types (``"line": -1``, ``"params": null``) was logged and left unanswered.
Here:

- a header line is read at most :data:`MAX_HEADER` bytes at a time;
- a message longer than :data:`MAX_MESSAGE` is dropped unread, with one line on
  standard error: its header is not passed on, so pygls reads its body as lines of
  unknown headers and skips them, and the next message's header, found at the end of
  the line the body ends, starts the next message;
- a request whose parameters cannot be read is answered with InvalidParams (-32602), in
  one line naming the method.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import BinaryIO

from cattrs.errors import ClassValidationError
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol

# A plan is at most 4 MiB (dslc.front.parse.MAX_BYTES) and JSON writes a byte in at most
# six (\u0000): a document's whole text fits in a message of this many bytes, with room.
MAX_MESSAGE = 32 * 2**20
MAX_HEADER = 4096  # bytes of a header line read at once ("Content-Type: …" is 56)
_LENGTH = re.compile(rb"Content-Length: *(\d+)\r\n\Z", re.IGNORECASE)  # digits: fewer than int() reads

logger = logging.getLogger(__name__)


class Framed:
    """The client's stream as pygls reads it (``readline``, ``read``), with the bounds above."""

    def __init__(self, raw: BinaryIO):
        self.raw = raw

    def readline(self) -> bytes:
        line = self.raw.readline(MAX_HEADER)
        m = _LENGTH.search(line)
        if m is None:
            return line
        if int(m.group(1)) > MAX_MESSAGE:
            digits = m.group(1).decode()
            logger.error("a message of %s bytes, more than the %d MiB a message may be: dropped",
                         digits if len(digits) <= 20 else f"{digits[:20]}… ({len(digits)} digits)", MAX_MESSAGE // 2**20)
            return b"Content-Length: dropped\r\n"  # no length: pygls reads no body
        # the header alone, without what came before it on its line: the end of a body
        # that was dropped (a body has no line break of its own to end it)
        return b"Content-Length: %d\r\n" % int(m.group(1))

    def read(self, n: int) -> bytes:
        return self.raw.read(min(n, MAX_MESSAGE))


@dataclass(frozen=True)
class _Refused:
    """A request that cannot be read, to be answered with ``error``."""

    id: int | str | None
    error: JsonRpcException
    jsonrpc: str = "2.0"


class Protocol(LanguageServerProtocol):
    """pygls's protocol, answering every request, even one it cannot read."""

    def structure_message(self, data: dict):
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            if "id" not in data or "method" not in data:
                raise  # a notification or a response: no one waits for an answer
            method = data["method"] if isinstance(data["method"], str) else "?"
            error = JsonRpcInvalidParams(message=f"invalid parameters of {method[:100]!r}: {_why(e.__cause__)}")
            msg_id = data["id"] if isinstance(data["id"], (int, str)) and not isinstance(data["id"], bool) else None
            return _Refused(msg_id, error)

    def handle_message(self, message) -> None:
        if isinstance(message, _Refused):
            logger.warning("%s", message.error.message)
            self._send_response(message.id, None, message.error.to_response_error())
        else:
            super().handle_message(message)


def _why(e: BaseException | None) -> str:
    """The first reason cattrs gives for parameters it could not read, in one line."""
    while isinstance(e, ClassValidationError) and e.exceptions:
        e = e.exceptions[0]
    why = f"{e} is missing" if isinstance(e, KeyError) else str(e) or type(e).__name__
    return (why.splitlines() or ["?"])[0][:200]
