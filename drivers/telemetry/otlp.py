"""--otlp: an OTLP/HTTP receiver for the engine's own trace spans, on the driver's event loop.

vLLM (`--otlp-traces-endpoint`, with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf) and the simulated engine
POST an `ExportTraceServiceRequest` (protobuf) to /v1/traces when requests end; each `llm_request` span becomes
one EngineSpan event, which the state fold joins to its turn by request id (drivers/model/state.py). A bad
request (not an OTLP export, or over the size cap) is answered 400 and recorded as a TraceReceiverError; it never
stops the run.
The HTTP side is a small HTTP/1.1 server on asyncio streams: one route, Content-Length or chunked bodies.
"""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from collections.abc import Callable

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.counted import counted

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 16 << 20  # 16 MiB: thousands of spans per export; anything larger is refused (400)
REQUEST_SPAN = "llm_request"  # vLLM's span per request; its startup spans ("Load weights", ...) are ignored
ENGINE_ID_PREFIXES = ("chatcmpl-", "cmpl-")  # what vLLM puts before the X-Request-Id in gen_ai.request.id
_FIGURES = {
    "gen_ai.latency.time_in_queue": "queued_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_s",
    "gen_ai.latency.time_to_first_token": "ttft_s",
    "gen_ai.latency.time_in_model_decode": "decode_s",
    "gen_ai.latency.e2e": "e2e_s",
}


# The resource attributes that name the engine instance that served a span, in order of preference: the
# OpenTelemetry standard's own (OTEL_RESOURCE_ATTRIBUTES=service.instance.id=r0 on each replica).
BACKEND_ATTRIBUTES = ("service.instance.id", "service.name", "host.name")


class BadTraces(ValueError):
    """A request whose body is not an OTLP trace export (or too large): answered 400 and counted."""


def _value(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


def engine_request_id(raw: str) -> str:
    """The X-Request-Id the client sent: vLLM's `chatcmpl-<id>` without its prefix."""
    for prefix in ENGINE_ID_PREFIXES:
        if raw.startswith(prefix):
            return raw[len(prefix) :]
    return raw


def backend_of(resource_attrs: dict[str, object]) -> str:
    """The span's engine instance: the first of BACKEND_ATTRIBUTES its resource sets ("" for none). The SDK's
    placeholder service name (`unknown_service...`) names nothing."""
    for key in BACKEND_ATTRIBUTES:
        v = resource_attrs.get(key)
        if isinstance(v, str) and v and not v.startswith("unknown_service"):
            return v
    return ""


def decode_spans(body: bytes, t: float) -> list[ev.EngineSpan]:
    """The `llm_request` spans of one OTLP/HTTP protobuf body, as events stamped `t`; BadTraces when it is not one."""
    msg = ExportTraceServiceRequest()
    try:
        msg.ParseFromString(body)
    except (DecodeError, ValueError) as e:
        raise BadTraces(f"not an OTLP ExportTraceServiceRequest: {e}") from None
    out = []
    for rs in msg.resource_spans:
        backend = backend_of({a.key: _value(a.value) for a in rs.resource.attributes})
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs = {a.key: _value(a.value) for a in span.attributes}
                rid = attrs.get("gen_ai.request.id")
                if span.name != REQUEST_SPAN and not isinstance(rid, str):
                    continue
                figures = {f: float(v) for k, f in _FIGURES.items() if isinstance(v := attrs.get(k), int | float)}
                out.append(
                    ev.EngineSpan(
                        t=t,
                        request_id=engine_request_id(rid) if isinstance(rid, str) else "",
                        trace_id=span.trace_id.hex(),
                        backend=backend,
                        **figures,
                    )
                )
    return out


def _inflate(body: bytes, encoding: str) -> bytes:
    """A gzip or deflate body, never inflated past MAX_BODY_BYTES."""
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadTraces(f"Content-Encoding {encoding!r} not supported (gzip, deflate or none)")
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(body, MAX_BODY_BYTES + 1)
    except (zlib.error, gzip.BadGzipFile) as e:
        raise BadTraces(f"bad {encoding} body: {e}") from None
    if len(out) > MAX_BODY_BYTES:
        raise BadTraces(f"body inflates past {MAX_BODY_BYTES >> 20} MiB")
    return out


class OtlpReceiver:
    """Listens for OTLP/HTTP trace exports; each span is emitted as an EngineSpan, each bad request as a
    TraceReceiverError. `received` and `errors` count them; `follow` (a hub listener) learns the run's request
    ids, so `finish` can wait for the last turns' spans and say in a Notice which spans matched no turn."""

    FINAL_WAIT_S = 10.0  # the last spans' wait at the run's end: vLLM's batch exporter sends every 5 s

    def __init__(self, emit: Callable[[ev.AnyEvent], None], clock: Callable[[], float]):
        self.emit, self.clock = emit, clock
        self.received: set[str] = set()  # request ids of the spans received so far
        self.spans = 0
        self.unmatched = 0  # spans whose request id no request of this run carried
        self.errors = 0
        self._sent: set[str] = set()  # every request id this run sent
        self._in_flight: dict[str, str] = {}  # session -> the id of its request in flight
        self._due: set[str] = set()  # request ids of the turns that ended well: each awaits its span
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        """Listen (OSError when it cannot)."""
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    def follow(self, e: ev.AnyEvent) -> None:
        """A hub listener: the ids sent, and which turns ended well (their spans are due)."""
        if isinstance(e, ev.RequestSent) and e.request_id:
            self._in_flight[e.session] = e.request_id
            self._sent.add(e.request_id)
        elif isinstance(e, ev.TurnDone) and e.status == "ok" and (rid := self._in_flight.get(e.session)):
            self._due.add(rid)

    async def finish(self, wait: bool, cut_short: asyncio.Event | None = None) -> None:
        """The run's end: wait (`wait`, FINAL_WAIT_S at most, less once `cut_short` is set: the user stopped) for
        the spans of its last turns, stop listening, and say in one Notice what the spans left unexplained
        (spans of no turn, turns whose span never came)."""
        deadline = time.monotonic() + self.FINAL_WAIT_S
        while wait and self._due - self.received and time.monotonic() < deadline:
            if cut_short is not None and cut_short.is_set():
                break
            await asyncio.sleep(0.05)
        await self.aclose()
        missing = len(self._due - self.received) if wait else 0
        parts = []
        if self.unmatched:
            parts.append(
                f"{counted(self.unmatched, 'span')} matched no turn of this run (another client's or an older run's)"
            )
        if missing:
            parts.append(f"{counted(missing, 'turn')} got no span within {self.FINAL_WAIT_S:.0f} s of the end")
        if parts:
            self.emit(ev.Notice(t=self.clock(), level="warn", message="OTLP: " + "; ".join(parts)))

    async def aclose(self) -> None:
        """Stop listening and end the exporters' kept-alive connections (their handlers finish, not cancelled
        at the loop's end, which asyncio would report as an error)."""
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the exporter went away or spoke no HTTP: nothing to answer
        except asyncio.CancelledError:
            pass  # aclose(): this connection's own task ends quietly with the receiver
        finally:
            self._connections.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is done."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")  # the reader's limit (64 KiB) bounds the headers
        except asyncio.LimitOverrunError:
            return self._refuse(writer, BadTraces("request headers over 64 KiB"))
        lines = head.decode("latin-1").split("\r\n")
        method, path, *_ = lines[0].split(" ") + ["", ""]
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k:
                headers[k.strip().lower()] = v.strip()
        keep = headers.get("connection", "").lower() != "close"
        if path.split("?")[0] != TRACES_PATH:
            await self._drain(reader, headers)
            return self._answer(writer, 404, b"not found", keep)
        if method != "POST":
            await self._drain(reader, headers)
            return self._answer(writer, 405, b"POST only", keep)
        try:
            body = await self._body(reader, headers)
            body = _inflate(body, headers.get("content-encoding", "").lower())
            spans = decode_spans(body, self.clock())
        except BadTraces as e:
            return self._refuse(writer, e)
        for span in spans:
            self.spans += 1
            self.received.add(span.request_id)
            self.unmatched += span.request_id not in self._sent
            self.emit(span)
        ok = ExportTraceServiceResponse().SerializeToString()
        return self._answer(writer, 200, ok, keep, "application/x-protobuf")

    def _refuse(self, writer: asyncio.StreamWriter, e: BadTraces) -> bool:
        """A bad request: counted, recorded, answered 400, and its connection closed (the rest is unread)."""
        self.errors += 1
        self.emit(ev.TraceReceiverError(t=self.clock(), error=str(e)))
        return self._answer(writer, 400, str(e).encode(), keep=False)

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts, total = [], 0
            while True:
                line = (await reader.readuntil(b"\r\n")).split(b";")[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    raise BadTraces(f"bad chunk size {line[:20]!r}") from None
                total += size
                if total > MAX_BODY_BYTES:
                    raise BadTraces(f"body over {MAX_BODY_BYTES >> 20} MiB")
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return b"".join(parts)
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise BadTraces(f"bad Content-Length {length!r}")
        if int(length) > MAX_BODY_BYTES:
            left = int(length) if int(length) <= 4 * MAX_BODY_BYTES else 0  # read past, so the sender sees the 400
            while left > 0:
                left -= len(await reader.readexactly(min(left, 1 << 20)))
            raise BadTraces(f"body of {int(length):,} bytes is over {MAX_BODY_BYTES >> 20} MiB")
        return await reader.readexactly(int(length))

    async def _drain(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> None:
        length = headers.get("content-length", "0")
        if length.isdigit() and int(length) <= MAX_BODY_BYTES:
            await reader.readexactly(int(length))

    @staticmethod
    def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, keep: bool, kind: str = "text/plain") -> bool:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
        head = (
            f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        return keep
