"""A whole run: probe the server, plan the ramps, drive the sessions and the
samplers, and close the recording, whatever happens."""

from __future__ import annotations

import asyncio
import base64
import os
import platform
import random
import secrets
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

import rampwatch.drivers as drivers
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.client.chat import monotonic_clock
from rampwatch.drivers.telemetry.gpu import GpuSampler
from rampwatch.drivers.run.hub import EventHub
from rampwatch.drivers.telemetry.metrics import MetricsScraper, redact_url
from rampwatch.drivers.client.ramp import DEFAULT_TEMPLATE_TOKENS, Calibration, Conversation, Filler
from rampwatch.drivers.run.recording import Recorder
from rampwatch.drivers.client.session import SessionRunner, TurnOptions
from rampwatch.drivers.model.state import RunState


class BadInput(Exception):
    """Something the user asked for cannot work; one line, exit code 2."""


@dataclass
class RunConfig:
    url: str
    mode: str = "run"  # run | watch | demo
    model: str | None = None
    sessions: int = 1
    stagger: float = 0.0
    schedule: list[int] = field(default_factory=list)
    output_tokens: int = 128
    ignore_eos: bool = False
    metrics_urls: list[str] = field(default_factory=list)
    gpu: str = "auto"
    scrape_interval: float = 0.5
    record: Path | None = None
    api_key: str | None = None
    retries: int = 0
    request_timeout: float = 3600.0
    reconnect_timeout: float = 180.0
    command: list[str] = field(default_factory=list)
    record_text: bool = False  # keep prompt and reply text in the recording (large, maybe private)
    concurrency: int | None = None  # sessions in flight at once (None: all); the peer benchmark adapter uses it

    @property
    def base_url(self) -> str:
        """The server URL without credentials (those travel in headers())."""
        return redact_url(self.url.rstrip("/").removesuffix("/v1"))

    def headers(self) -> dict[str, str]:
        """Authorization for every request: the API key as Bearer, else user:password@ from the URL as Basic."""
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        u = urlsplit(self.url)
        if u.username is None:
            return {}
        pair = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


@dataclass
class ServerInfo:
    model: str
    max_model_len: int | None
    engine: str | None
    engine_version: str | None


async def probe(client: httpx.AsyncClient, cfg: RunConfig) -> ServerInfo:
    """Who is serving, and which model: bad input is found before any traffic."""
    base = where = cfg.base_url  # credentials already stripped
    try:
        r = await client.get(base + "/v1/models", headers=cfg.headers(), timeout=10.0)
    except httpx.HTTPError as e:
        raise BadInput(f"cannot reach {where}: {type(e).__name__} (is the server up?)") from None
    if r.status_code in (401, 403):
        raise BadInput(f"{where} refused the request (HTTP {r.status_code}): check --api-key-env / --api-key-file")
    try:
        data = r.json()["data"]
        models = [m["id"] for m in data]
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"{where} is not an OpenAI-compatible server (GET /v1/models gave HTTP {r.status_code})") from None
    if not models:
        raise BadInput(f"{where} serves no models")
    model = cfg.model or models[0]
    if model not in models:
        raise BadInput(f"model {model!r} is not served by {where} (it serves: {', '.join(models)})")
    entry = data[models.index(model)]
    meta = entry.get("meta") or {}  # llama.cpp puts its context size here
    max_len = entry.get("max_model_len") or meta.get("n_ctx") or meta.get("n_ctx_train")
    owned = str(entry.get("owned_by", ""))
    version = None
    try:
        v = await client.get(base + "/version", headers=cfg.headers(), timeout=5.0)
        if v.status_code == 200:
            version = v.json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    # None when /v1/models does not say: the report then names the engine its /metrics revealed.
    engine = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp"}.get(owned, owned or None)
    return ServerInfo(model=model, max_model_len=max_len, engine=engine, engine_version=version)


def check_schedule(cfg: RunConfig, info: ServerInfo) -> None:
    if info.max_model_len and cfg.schedule[-1] + cfg.output_tokens > info.max_model_len:
        raise BadInput(
            f"the ramp's last turn ({cfg.schedule[-1]:,} tokens + {cfg.output_tokens} output) exceeds the server's "
            f"max_model_len {info.max_model_len:,}; try --scale-to {_suggest(info.max_model_len - cfg.output_tokens)}"
        )


def _suggest(limit: int) -> str:
    k = int(limit * 0.95) // 1024
    return f"{k}k" if k else str(int(limit * 0.95))


async def calibrate(client: httpx.AsyncClient, cfg: RunConfig, model: str, probe_conv: Conversation) -> Calibration:
    """Measure the server's tokenizer once: filler chars per token, chat-template
    tokens around a message, and the needle's fixed text. Falls back to rough
    figures where /tokenize is missing (usage then corrects from turn 2)."""
    sample = Filler(random.Random(7)).text(20_000)

    async def count(body: dict[str, object]) -> int | None:
        for form in (body, {"content": body.get("prompt")} if "prompt" in body else None):
            if form is None:
                continue
            try:
                r = await client.post(cfg.base_url + "/tokenize", json={"model": model, **form}, headers=cfg.headers(), timeout=30.0)
                if r.status_code == 200:
                    data = r.json()
                    n = data.get("count")
                    return int(n) if n is not None else len(data.get("tokens") or [])
            except (httpx.HTTPError, ValueError, AttributeError, TypeError):
                pass
        return None

    plain = await count({"prompt": sample})
    if not plain:
        return Calibration()
    specials = await count({"prompt": ""}) or 0
    chars_per_token = len(sample) / max(1, plain - specials)
    chat = await count({"messages": [{"role": "user", "content": sample}]})
    template = chat - plain + specials if chat is not None else DEFAULT_TEMPLATE_TOKENS
    fixed = []
    for turn in (1, 2):
        n = await count({"prompt": probe_conv.fixed_text(turn)})
        fixed.append(n - specials if n is not None else round(len(probe_conv.fixed_text(turn)) / chars_per_token))
    return Calibration(chars_per_token=chars_per_token, template_tokens=max(0, template), fixed_tokens=(fixed[0], fixed[1]))


def new_salt() -> str:
    return secrets.token_hex(6)


def default_record_path(model: str, folder: Path = Path("recordings")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.split("/")[-1])[:40]
    return folder / f"{stamp}-{safe}.jsonl"


class Run:
    """Owns one run's hub, clock and tasks. `prepare` validates (BadInput),
    `drive` runs to the end or until cancelled, always closing the recording."""

    def __init__(self, cfg: RunConfig, record: bool = True, keep_events: bool = False):
        self.cfg = cfg
        self.record = record
        self.clock = monotonic_clock()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")  # wall time of t = 0
        self.state = RunState()
        self.hub = EventHub(self.state, keep_events=keep_events)
        self.info: ServerInfo | None = None
        self.salt = new_salt()
        self.calibration = Calibration()
        self.exit_code = 0
        self.interrupted_by: int | None = None
        self._client: httpx.AsyncClient | None = None

    def _client_for(self) -> httpx.AsyncClient:
        if self._client is None:
            n = max(1, self.cfg.sessions) + 4
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.cfg.request_timeout, connect=10.0),
                limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            )
        return self._client

    async def prepare(self) -> None:
        cfg = self.cfg
        client = self._client_for()
        if cfg.mode == "watch":
            info = ServerInfo(model=cfg.model or "", max_model_len=None, engine=None, engine_version=None)
            try:
                info = await probe(client, cfg)
            except BadInput:
                pass  # watching needs only /metrics; a server without /v1/models is fine
        else:
            info = await probe(client, cfg)
            check_schedule(cfg, info)
            self.calibration = await calibrate(client, cfg, info.model, self.conversation(1))
        self.info = info
        header = self.header()
        if self.record:
            path = cfg.record or default_record_path(info.model or "watch")
            if cfg.record is None:
                path.parent.mkdir(parents=True, exist_ok=True)
            problem = Recorder.check_path(path)
            if problem:
                raise BadInput(problem + " (or pass --no-record)")
            try:
                self.hub.recorder = Recorder(path, header)
            except OSError as e:
                raise BadInput(f"cannot create recording {path}: {e.strerror or e} (or pass --no-record)") from None
        self.state.header = header

    def conversation(self, k: int) -> Conversation:
        """Session k's conversation (1-based): its own salt, so sessions share no prefix."""
        return Conversation(f"{self.salt}-s{k}", self.cfg.schedule, self.calibration)

    def header(self) -> ev.Header:
        info = self.info
        return ev.Header(
            rampwatch_version=drivers.__version__,
            command=self.cfg.command,
            mode=self.cfg.mode,
            server=self.cfg.base_url,
            model=info.model if info else None,
            engine=info.engine if info else None,
            engine_version=info.engine_version if info else None,
            max_model_len=info.max_model_len if info else None,
            host=platform.node(),
            started_at=self.started_at,
            sessions=self.cfg.sessions if self.cfg.mode != "watch" else 0,
            output_tokens=self.cfg.output_tokens,
            salt=self.salt,
        )

    @property
    def recording_path(self) -> Path | None:
        return self.hub.recorder.path if self.hub.recorder else None

    async def drive(self) -> int:
        """Run to the end. Returns the exit code (0 ok, 1 failed turns, 130/143 interrupted)."""
        cfg, emit, clock = self.cfg, self.hub.emit, self.clock
        samplers = [MetricsScraper(u, cfg.scrape_interval, emit, clock, headers=cfg.headers()) for u in cfg.metrics_urls]
        background = [asyncio.create_task(s.run()) for s in samplers]
        background.append(asyncio.create_task(GpuSampler(cfg.gpu, max(cfg.scrape_interval, 1.0), emit, clock).run()))
        background.append(asyncio.create_task(self._flush_loop()))
        runners: list[SessionRunner] = []
        status = "done"
        try:
            if cfg.mode == "watch":
                await asyncio.Event().wait()  # until interrupted
            assert self.info is not None
            opts = TurnOptions(model=self.info.model, output_tokens=cfg.output_tokens, ignore_eos=cfg.ignore_eos,
                               retries=cfg.retries, reconnect_timeout=cfg.reconnect_timeout, record_text=cfg.record_text,
                               request_timeout=cfg.request_timeout)
            for k in range(cfg.sessions):
                conv = self.conversation(k + 1)
                r = SessionRunner(f"s{k + 1}", conv, self._client_for(), cfg.base_url, cfg.headers(), opts, emit, clock)
                runners.append(r)
                emit(r.plan_event())
            slots = asyncio.Semaphore(cfg.concurrency or len(runners) or 1)
            tasks = [asyncio.create_task(self._staggered(r, k * cfg.stagger, slots)) for k, r in enumerate(runners)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            self.exit_code = 1 if any(r.failed for r in runners) else 0
            status = "failed" if self.exit_code else "done"
        except asyncio.CancelledError:
            status = "interrupted"
            self.exit_code = 143 if self.interrupted_by == signal.SIGTERM else 130
        finally:
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self.hub.flush(force=True)  # a disk that filled up gets one more try, and says so
            emit(ev.RunEnded(t=clock(), status=status, exit_code=self.exit_code))
            self.close()
            if self._client is not None:
                await self._client.aclose()
        return self.exit_code

    async def _staggered(self, runner: SessionRunner, delay: float, slots: asyncio.Semaphore) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        async with slots:
            await runner.run()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(Recorder.FLUSH_EVERY)
            self.hub.flush()

    def close(self) -> None:
        rec = self.hub.recorder
        if rec is not None:
            rec.close()

    async def aclose(self) -> None:
        """Release what prepare() opened when the run never starts."""
        self.close()
        if self._client is not None:
            await self._client.aclose()

    def mark(self, note: str) -> None:
        self.hub.emit(ev.Mark(t=self.clock(), note=note))


def load_api_key(env_var: str | None, key_file: str | None) -> str | None:
    """The API key from --api-key-file, --api-key-env, or OPENAI_API_KEY. It is
    only ever put in request headers: never printed, logged or recorded."""
    if key_file:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as e:
            raise BadInput(f"--api-key-file {key_file}: {e.strerror or e}") from None
        if not key:
            raise BadInput(f"--api-key-file {key_file}: the file is empty")
        return key
    if env_var:
        key = os.environ.get(env_var)
        if not key:
            raise BadInput(f"--api-key-env {env_var}: the variable is not set")
        return key
    return os.environ.get("OPENAI_API_KEY") or None
