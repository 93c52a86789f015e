"""One connection of the HTTP server, served on the event loop from accept to close.

The TLS handshake, the request head and the body are all read here, on the loop: a slow
or half-sent request costs a buffer, never a thread. Only a complete request goes to a
worker (the server's `dispatch`), and its answer comes back whole to be written out here,
so a client that reads slowly holds no worker either.

Deadlines, as Apache's mod_reqtimeout sets them:
- a connection's TLS handshake and first request head have `header_timeout` in total; a
  kept-alive connection may then idle `timeout` before its next request begins, whose
  head again has `header_timeout`. A handshake unfinished at its deadline is closed
  without a reply (there is no HTTP to answer in); a head gets a 408.
- the body has `body_timeout`, pushed one second further for every `body_min_rate` bytes
  received; slower is a 408.
- writing an answer may take `timeout` plus a second per `body_min_rate` bytes.

Framing is read strictly (a proxy in front that reads a request's end differently from
us is how requests are smuggled). The raw head is checked before h11 sees it, because h11
normalises what it parses: it merges a repeated identical Content-Length (and `5, 5`),
unfolds obs-fold lines and takes bare LF line ends, each of which is a 400 here
(RFC 9112 sections 2.2, 5.2 and 6.3 let a server refuse them). h11 then parses the rest: a
repeated Host, both Content-Length and Transfer-Encoding, whitespace before a colon, a
malformed chunk are 400s; a chunk announcing more than the body limit is a 413 at once.
Every refusal closes the connection, after a brief lingering close so the client reads
it; what came after the refused request is never parsed.
"""
from __future__ import annotations

import asyncio
import logging
import re
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Callable

import h11

from .httpadmission import Busy, Slot
from .httpwsgi import WsgiAnswer, build_environ

if TYPE_CHECKING:
    from .httpserver import HttpServer

log = logging.getLogger("fabricscope.http")

READ_SIZE = 65536
# How long the unread rest of a refused request is read and dropped before closing:
# closing with unread bytes sends a reset, which makes the client's kernel discard the
# answer it has not read yet.
LINGER_SECONDS = 1.0
# An error message longer than this is cut: it never carries a whole client value back.
MAX_MESSAGE = 1024

ErrorBody = Callable[[int, str], tuple[str, bytes]]


# The end of a request head: an empty line, however its line ends are written (a bare LF
# included, so that one is found and refused rather than waited on).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_BARE_LF = re.compile(rb"(?<!\r)\n")
_DIGITS = re.compile(rb"[0-9]+\Z")


def check_raw_head(head: bytes) -> None:
    """Refuse what h11 would quietly normalise, on the head's bytes as they came."""
    if _BARE_LF.search(head):
        raise Refusal(400, "a line of the request head ends in a bare LF; end lines with CRLF")
    lengths = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:1] in (b" ", b"\t"):
            raise Refusal(400, "a header line is folded (obs-fold); send each header on one line")
        name, colon, value = line.partition(b":")
        if colon and name.lower() == b"content-length":
            lengths += 1
            if lengths > 1:
                raise Refusal(400, "Content-Length is repeated; send it once")
            if not _DIGITS.match(value.strip(b" \t")):
                raise Refusal(400, "Content-Length is not one decimal number")


def capped(message: str) -> str:
    """An error message cut to MAX_MESSAGE characters."""
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "..."


def plain_error_body(status: int, message: str) -> tuple[str, bytes]:
    return "text/plain; charset=utf-8", f"{message}\n".encode()


@dataclass(frozen=True)
class Deadlines:
    timeout: float
    header_timeout: float
    body_timeout: float
    body_min_rate: float


class Refusal(Exception):
    """Answer `status` with `message` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Connection:
    def __init__(self, server: "HttpServer", reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 slot: "Slot | None" = None) -> None:
        self.server, self.reader, self.writer, self.slot = server, reader, writer, slot
        self.peer = writer.get_extra_info("peername")[:2]
        self.source = self.peer[0]
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=server.max_header_bytes)
        self.loop = asyncio.get_running_loop()
        self.tls = False
        self._raw_head = bytearray()
        self._head_checked = True

    async def serve(self) -> None:
        deadlines = self.server.deadlines
        first_deadline = self.loop.time() + deadlines.header_timeout
        try:
            if self.server.ssl_context is not None:
                try:
                    async with asyncio.timeout_at(first_deadline):
                        await self.writer.start_tls(self.server.ssl_context)
                except (TimeoutError, ssl.SSLError, OSError, ValueError):
                    return                        # no HTTP to answer in
                self.tls = True
            deadline: float | None = first_deadline
            while await self._one_request(deadline):
                deadline = None
        except Refusal as refusal:
            await self._refuse(refusal.status, str(refusal))
        except (ConnectionError, OSError, ssl.SSLError, TimeoutError):
            pass                                  # the client went away, or stopped reading
        finally:
            self._close()

    # ---- one request ----------------------------------------------------------------------

    async def _one_request(self, deadline: float | None) -> bool:
        """Serve one request; whether the connection stays open for another."""
        request = await self._read_head(deadline)
        if request is None:
            return False
        gate = self.server.source_requests
        try:
            await gate.acquire(self.source)
        except Busy as busy:
            raise Refusal(503, str(busy)) from None
        try:
            body = await self._read_body()
            if self.slot is not None and not self.slot.proven:
                self.server.connections.prove(self.slot)     # in use: never dropped for another
            answer = await self._dispatch(request, body)
            await self._write_answer(request, answer)
        finally:
            gate.release(self.source)
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            return False                          # Connection: close, HTTP/1.0, ...
        self.h11.start_next_cycle()
        return True

    async def _read_head(self, deadline: float | None) -> h11.Request | None:
        # Never more than the header limit and a byte handed to h11 before the head is
        # complete: h11 measures only what it still holds unparsed, so a head that came in
        # one large read would pass its check.
        room = self.server.max_header_bytes + 1
        saw_line_end = False
        # What h11 holds unparsed already (a pipelined request) and every read until the
        # head is complete: checked raw before h11 parses it.
        self._raw_head = bytearray(self.h11.trailing_data[0])
        self._head_checked = False
        event = self._next_event(head=True)
        if event is h11.NEED_DATA and deadline is None:
            # Between requests: wait for the next one to begin, up to the idle timeout.
            try:
                async with asyncio.timeout(self.server.deadlines.timeout):
                    data = await self.reader.read(room)
            except TimeoutError:
                return None
            room -= len(data)
            saw_line_end = b"\n" in data
            self._receive_head(data)
            event = self._next_event(head=True, saw_line_end=saw_line_end)
        if event is h11.NEED_DATA:
            event = await self._read_rest_of_head(deadline, room, saw_line_end)
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request), event
        self._check_framing(event)
        return event

    async def _read_rest_of_head(self, deadline: float | None, room: int, saw_line_end: bool):
        """Read until h11 has the whole head; its first event after. (A head usually comes
        in one read, and then no deadline is set up here at all.)"""
        if deadline is None:
            deadline = self.loop.time() + self.server.deadlines.header_timeout
        event = h11.NEED_DATA
        try:
            async with asyncio.timeout_at(deadline):
                while event is h11.NEED_DATA:
                    data = await self.reader.read(max(1, room))
                    room -= len(data)
                    saw_line_end = saw_line_end or b"\n" in data
                    self._receive_head(data)
                    event = self._next_event(head=True, saw_line_end=saw_line_end)
        except TimeoutError:
            raise Refusal(408, "the request line and headers did not arrive in time") from None
        return event

    def _receive_head(self, data: bytes) -> None:
        if not self._head_checked:
            self._raw_head += data
        self.h11.receive_data(data)

    def _check_raw_head(self) -> None:
        end = _HEAD_END.search(self._raw_head)
        if end is not None:
            self._head_checked = True
            head = bytes(self._raw_head[:end.end()])
            self._raw_head = bytearray()
            check_raw_head(head.lstrip(b"\r\n"))     # h11 skips empty lines before a request

    def _next_event(self, head: bool = False, saw_line_end: bool = True):
        if head and not self._head_checked:
            self._check_raw_head()
        try:
            return self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            if head and status == 431 and not saw_line_end:
                raise Refusal(414, "the request line is too long") from None
            if self.h11.their_state in (h11.SEND_BODY, h11.DONE) or not head and self.h11.our_state is h11.SEND_RESPONSE:
                raise Refusal(400, f"malformed request body: {exc}") from None
            if status == 431:
                raise Refusal(431, "the request headers are too large") from None
            raise Refusal(status, f"malformed request: {exc}") from None

    def _check_framing(self, request: h11.Request) -> None:
        names = [name for name, _ in request.headers]
        if names.count(b"host") > 1:
            raise Refusal(400, "duplicate Host header")
        if b"content-length" in names and b"transfer-encoding" in names:
            raise Refusal(400, "both Content-Length and Transfer-Encoding")
        length = next((int(value) for name, value in request.headers if name == b"content-length"), 0)
        if length > self.server.max_body_bytes:
            raise Refusal(413, f"request body of {length} bytes exceeds the {self.server.max_body_bytes}-byte limit")

    async def _read_body(self) -> bytes:
        if self.h11.they_are_waiting_for_100_continue:
            await self._send(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        event = self._next_event()
        if event.__class__ is h11.EndOfMessage:
            return b""                            # no body (a GET): no deadline to set up
        rate = self.server.deadlines.body_min_rate
        start = self.loop.time() + self.server.deadlines.body_timeout
        limit = self.server.max_body_bytes
        body = bytearray()
        received = 0
        try:
            async with asyncio.timeout_at(start) as timer:
                while True:
                    if len(body) + self._announced_chunk() > limit:
                        raise Refusal(413, f"a chunk announces more than the {limit}-byte body limit")
                    if event is h11.NEED_DATA:
                        data = await self.reader.read(READ_SIZE)
                        received += len(data)
                        if rate:
                            timer.reschedule(start + received / rate)
                        self.h11.receive_data(data)
                    elif isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > limit:
                            raise Refusal(413, f"request body exceeds the {limit}-byte limit")
                    elif isinstance(event, h11.EndOfMessage):
                        return bytes(body)
                    else:                         # closed part-way
                        raise ConnectionResetError("the client closed during the body")
                    event = self._next_event()
        except TimeoutError:
            raise Refusal(408, "the request body did not arrive in time; send it faster or in smaller "
                               "requests") from None

    def _announced_chunk(self) -> int:
        """Bytes of the current chunk still to come, as its size line announced them. h11
        keeps this in its chunked reader and does not expose it; without it a chunk size of
        2^64 would be found out only at the body's deadline (a 408), not at once."""
        return getattr(getattr(self.h11, "_reader", None), "_bytes_in_chunk", 0) or 0

    async def _dispatch(self, request: h11.Request, body: bytes) -> WsgiAnswer:
        environ = build_environ(request, body, scheme="https" if self.tls else "http",
                                server=self.server.bind_addr, peer=self.peer)
        try:
            return await self.server.dispatch(environ, self.source)
        except Busy as busy:
            raise Refusal(503, str(busy)) from None

    async def _write_answer(self, request: h11.Request, answer: WsgiAnswer) -> None:
        head_only = request.method == b"HEAD"
        headers = [(name, value) for name, value in answer.headers
                   if name.lower() != "transfer-encoding" and (head_only or name.lower() != "content-length")]
        if not head_only:
            headers.append(("Content-Length", str(len(answer.body))))
        data = self.h11.send(h11.Response(status_code=answer.status, headers=headers,
                                          reason=answer.reason.encode("latin-1")))
        if not head_only and answer.body:
            data += self.h11.send(h11.Data(data=answer.body))
        data += self.h11.send(h11.EndOfMessage())
        await self._send(data)

    # ---- writing and closing --------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        deadlines = self.server.deadlines
        allowed = deadlines.timeout + (len(data) / deadlines.body_min_rate if deadlines.body_min_rate else 0)
        self.writer.write(data)
        if not self.writer.transport.get_write_buffer_size():
            return                                # all in the socket: nothing to wait for
        async with asyncio.timeout(allowed):
            await self.writer.drain()

    async def _refuse(self, status: int, message: str) -> None:
        """Answer with an error and close, reading what the client still sends for a moment."""
        content_type, body = self.server.error_body(status, capped(message))
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n")
        if status == 503:
            head += "Retry-After: 1\r\n"
        try:
            await self._send(head.encode("latin-1") + b"\r\n" + body)
            if self.writer.can_write_eof():
                self.writer.write_eof()
            async with asyncio.timeout(LINGER_SECONDS):
                while await self.reader.read(READ_SIZE):
                    pass
        except (ConnectionError, OSError, ssl.SSLError, TimeoutError):
            pass

    def _close(self) -> None:
        # close() writes out what is buffered (and a TLS close_notify) first; a client
        # that reads none of it must not keep the transport, so it is dropped after a
        # grace period.
        transport = self.writer.transport
        transport.close()
        self.loop.call_later(self.server.deadlines.timeout, transport.abort)
