"""The simulated engine's OTLP trace spans (--otlp-traces-endpoint): one `llm_request` span per request, as vLLM
exports it, with the latencies taken from the scheduler's own clock (the same as its per-request metrics), POSTed
as OTLP/HTTP protobuf when the request ends. The protobuf is built with opentelemetry-proto's classes."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from rampwatch.drivers.sim.engine import SimRequest


def _attr(key: str, value: float | int | str) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def _trace_ids(traceparent: str | None) -> tuple[bytes, bytes]:
    """(trace id, parent span id) from a W3C traceparent; a fresh trace where there is none."""
    parts = (traceparent or "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        try:
            return bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
        except ValueError:
            pass
    return os.urandom(16), b""


def request_span(req: SimRequest, request_id: str, traceparent: str | None) -> Span | None:
    """vLLM's `llm_request` span of a finished request (None: it never got a first token)."""
    if req.scheduled_t is None or req.first_t is None or req.last_t is None:
        return None
    queued = req.scheduled_t - req.arrival
    prefill = req.first_t - req.scheduled_t
    decode = req.last_t - req.first_t
    e2e = req.last_t - req.taken
    trace, parent = _trace_ids(traceparent)
    end = time.time_ns()
    return Span(
        trace_id=trace,
        span_id=os.urandom(8),
        parent_span_id=parent,
        name="llm_request",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=end - int(e2e * 1e9),
        end_time_unix_nano=end,
        attributes=[
            _attr("gen_ai.latency.time_in_queue", queued),
            _attr("gen_ai.latency.time_in_model_prefill", prefill),
            _attr("gen_ai.latency.time_in_model_decode", decode),
            _attr("gen_ai.latency.time_in_model_inference", prefill + decode),
            _attr("gen_ai.latency.time_to_first_token", req.first_t - req.taken),
            _attr("gen_ai.latency.e2e", e2e),
            _attr("gen_ai.usage.prompt_tokens", req.prompt_tokens),
            _attr("gen_ai.usage.completion_tokens", req.generated),
            _attr("gen_ai.request.id", request_id),
        ],
    )


class SpanExporter:
    """POSTs each finished request's span to `endpoint`, one export per request end, in the background.
    `instance`: the engine's name among its replicas, its resource's `service.instance.id` (as a vLLM replica
    started with OTEL_RESOURCE_ATTRIBUTES=service.instance.id=r0 says it); "" sets none."""

    def __init__(self, endpoint: str, instance: str = ""):
        self.endpoint = endpoint
        attrs = [_attr("service.instance.id", instance)] if instance else []
        self.resource = Resource(attributes=attrs)
        self.sent = 0
        self.failed = 0
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def request_ended(self, req: SimRequest, x_request_id: str | None, traceparent: str | None) -> None:
        span = request_span(req, f"chatcmpl-{x_request_id or f'sim{req.id}'}", traceparent)
        if span is None:
            return
        spans = ResourceSpans(resource=self.resource, scope_spans=[ScopeSpans(spans=[span])])
        body = ExportTraceServiceRequest(resource_spans=[spans])
        task = asyncio.get_running_loop().create_task(self._post(body.SerializeToString()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, body: bytes) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False, timeout=10.0)
        try:
            r = await self._client.post(self.endpoint, content=body, headers={"Content-Type": "application/x-protobuf"})
            r.raise_for_status()
            self.sent += 1
        except httpx.HTTPError as e:
            self.failed += 1
            if self.failed == 1:  # once: an exporter that cannot reach its collector says so, as vLLM's does
                print(f"rampwatch sim: OTLP export to {self.endpoint} failed: {e}", file=sys.stderr, flush=True)
