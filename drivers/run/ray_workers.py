"""--cluster ray / ray://HOST:PORT: the driver workers as Ray actors, `--workers-per-node` on each of the cluster's
nodes; the coordinator (the Run, on the machine that shows the UI) drives them through RayWorker links, as it does
local worker processes (workers.py). The only module that imports Ray, and only inside functions: Ray is an
optional extra (rampwatch[ray]).

- `--cluster ray`: `ray.init()`, which starts a Ray runtime on this machine (stopped at the run's end) or, with
  RAY_ADDRESS set (the GCS address, HEAD:6379, as `ray start` prints it), joins that cluster as a driver.
- `--cluster ray://HOST:PORT`: Ray Client (ray[client], in the extra) to a running cluster's client server, port
  10001 unless its head was started with another --ray-client-server-port. Only this process's connection ends with
  the run: someone's cluster is never stopped.

An actor runs a ShardDriver (worker.py) on a thread with the driver's own event loop (event_loop.run: its reads
stamped as a local worker's are), its lines kept in a bounded buffer the coordinator empties a batch at a time
(`take`, a long poll). A coordinator that falls behind loses events, never memory: past CAP_BYTES an event is
dropped and counted, and a Notice in the recording says how many; control lines (the clock exchange, the barrier,
the end) are always kept. Commands carry a sequence number: a threaded actor may run two calls out of order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run import worker_wire as ww
from rampwatch.drivers.run.config import BadInput, RunConfig

MISSING = "--cluster needs Ray: pip install 'rampwatch[ray]'"
CAP_BYTES = 64 << 20  # an actor's lines waiting for the coordinator, at most; past it events are dropped, counted
CAP_ENV = "RAMPWATCH_RAY_BUFFER_BYTES"  # another cap, read on the coordinator (a test drops events with a tiny one)
BATCH_BYTES = 4 << 20  # the most one take hands back
BATCH_S = 0.02  # a take that found events (and no control line) waits this long for more: fewer, larger batches
POLL_S = 0.5  # a take waits this long for a first line
DROPPED_EVERY_S = 5.0  # a Notice of dropped events at most this often (and one at the end)
CONTROL = b'{"type":"w_'  # how a control line (worker_wire's) starts: never dropped
DONE = b'{"type":"w_done"'  # ... and a WorkerDone's
CONNECT_TRIES = 3  # Ray Client connections tried (see RayCluster.connect)

_encode = msgspec.json.Encoder().encode


def buffer_bytes() -> int:
    """Each actor's cap: CAP_BYTES, or RAMPWATCH_RAY_BUFFER_BYTES where set (a number of bytes)."""
    text = os.environ.get(CAP_ENV, "").strip()
    try:
        return int(text) if text else CAP_BYTES
    except ValueError:
        raise BadInput(f"{CAP_ENV}={text!r}: a number of bytes") from None


def import_ray() -> Any:
    """Ray, or BadInput saying how to install it."""
    try:
        import ray
    except ImportError:
        raise BadInput(MISSING) from None
    return ray


class ShardActor:
    """A Ray actor (made one by RayCluster): one worker's ShardDriver on a thread of its own, its lines buffered."""

    def __init__(self, worker: int, node: str, cap_bytes: int = CAP_BYTES):
        self.worker, self.node, self.cap = worker, node, cap_bytes
        self._cond = threading.Condition()
        self._lines: deque[bytes] = deque()
        self._bytes = 0
        self._flushed = False  # a control line is waiting: a take returns at once
        self._dropped = 0
        self._told = 0  # dropped events a Notice has said
        self._told_at = 0.0
        self._finished = False  # the driver's thread has ended
        self._done_sent = False  # its WorkerDone is written: the last line the coordinator waits for
        self._error = ""
        self._next = 0  # the next command's sequence number
        self._early: dict[int, bytes] = {}  # commands that came before their turn
        self._pending: list[bytes] | None = []  # commands before the driver's loop runs (None: it runs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: Any = None

    def pid(self) -> int:
        return os.getpid()

    # -- the coordinator's calls (Ray's threads) -----------------------------------

    def command(self, seq: int, line: bytes) -> None:
        """A coordinator message, numbered from 0 (WorkerStart), handled in that order."""
        with self._cond:
            self._early[seq] = line
            while self._next in self._early:
                line = self._early.pop(self._next)
                self._next += 1
                if self._next == 1:
                    threading.Thread(target=self._main, args=(line,), name="rampwatch-worker", daemon=True).start()
                elif self._pending is not None:
                    self._pending.append(line)
                elif self._loop is not None:
                    try:
                        self._loop.call_soon_threadsafe(self._handle, line)
                    except RuntimeError:
                        pass  # its loop has closed: the run is over for it

    def take(self, wait: float = POLL_S) -> tuple[bytes, bool, str]:
        """The lines waiting (newline-separated), whether the worker has ended (and this is its last), and its
        error if it crashed. Waits up to `wait` for a first line, then BATCH_S for more unless a control line came."""
        with self._cond:
            if not self._lines and not self._finished:
                self._cond.wait(wait)
            if self._lines and not (self._flushed or self._finished):
                self._cond.wait(BATCH_S)
            out: list[bytes] = []
            size = 0
            while self._lines and size < BATCH_BYTES:
                line = self._lines.popleft()
                size += len(line) + 1
                out.append(line)
            self._bytes -= size
            self._flushed = False
            notice = self._dropped_notice()
            if notice is not None:
                out.insert(0, notice)
            return b"\n".join(out), self._finished and not self._lines, self._error

    def _dropped_notice(self) -> bytes | None:
        if self._dropped == self._told:
            return None
        now = time.monotonic()
        # The last is said with the worker's WorkerDone, ahead of it: once the coordinator has that, it reads no more.
        if not (self._finished or self._done_sent) and now - self._told_at < DROPPED_EVERY_S:
            return None
        self._told, self._told_at = self._dropped, now
        t = self._driver.clock() if self._driver is not None else 0.0
        message = (
            f"worker {self.worker}: {self._dropped} events dropped so far: the coordinator fell behind "
            f"(more than {f'{self.cap / 2**20:g} MiB' if self.cap >= 2**20 else f'{self.cap:,} bytes'} waiting)"
        )
        return _encode(ev.Notice(t=t, level="error", message=message))

    # -- the driver's thread ----------------------------------------------------------

    def _main(self, first: bytes) -> None:
        from rampwatch.drivers.run import event_loop

        try:
            start = ww.decode_to_worker(first)
            if not isinstance(start, ww.WorkerStart):
                raise ValueError("the first message must be WorkerStart")
            self.worker = start.worker  # a replacement is placed by its lost worker's slot, but named by its own id
            event_loop.run(_serve(self, start))
        except BaseException as e:  # noqa: BLE001 - said to the coordinator, which records the worker lost
            self._error = f"{type(e).__name__}: {e}"
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _handle(self, line: bytes) -> None:
        try:
            self._driver.command(ww.decode_to_worker(line))
        except Exception:  # noqa: BLE001 - a garbled command is ignored, never fatal (as worker.serve)
            return

    def _write(self, line: bytes) -> None:
        with self._cond:
            if self._bytes + len(line) > self.cap and not line.startswith(CONTROL):
                self._dropped += 1
                return
            self._lines.append(line)
            self._bytes += len(line) + 1
            if line.startswith(CONTROL):  # the clock exchange and the barrier wait on it: no batching
                self._flushed = True
                self._done_sent |= line.startswith(DONE)
                self._cond.notify_all()
            elif len(self._lines) == 1:
                self._cond.notify_all()

    def _flush(self) -> None:
        with self._cond:
            self._flushed = True
            self._cond.notify_all()


async def _serve(actor: ShardActor, start: ww.WorkerStart) -> None:
    """The actor's driver, on its thread's loop. Not a method: a class with a coroutine method is an async actor to
    Ray, whose calls share one loop, and a take waiting would hold up every command."""
    from rampwatch.drivers.run.worker import ShardDriver

    driver = ShardDriver(start, actor._write, actor._flush)
    driver.node = actor.node
    with actor._cond:
        actor._loop, actor._driver = asyncio.get_running_loop(), driver
        pending, actor._pending = actor._pending or [], None
    for line in pending:
        actor._handle(line)
    await driver.run()


class RayWorker:
    """The coordinator's link to one ShardActor (workers.WorkerLink): messages go as numbered calls, its lines come
    back by a long poll on the coordinator's loop; a poll that fails means the actor is gone."""

    def __init__(self, cluster: RayCluster, index: int):
        self.cluster, self.index = cluster, index
        self.node_id, self.node = cluster.placement(index)
        self.actor: Any = None
        self._seq = 0
        self._poll: asyncio.Task | None = None
        self._error = ""

    def start(self, message: ww.WorkerStart, on_line: Callable[[bytes], None], on_exit: Callable[[str], None]) -> None:
        self.actor = self.cluster.actor(self.index, self.node_id, self.node)
        self.send(message)
        self._poll = asyncio.ensure_future(self._take(on_line, on_exit))

    async def _take(self, on_line: Callable[[bytes], None], on_exit: Callable[[str], None]) -> None:
        try:
            while True:
                blob, finished, error = await self.actor.take.remote(POLL_S)
                for line in blob.split(b"\n") if blob else ():
                    on_line(line)
                if finished:
                    self._error = error
                    why = "crashed" if error else "finished"
                    break
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - RayActorError and its kin: the actor (or its node) is gone
            text = " ".join(str(e).split())
            why = f"Ray actor died ({type(e).__name__}: {text[:160]})"
        on_exit(why)

    def send(self, message: object) -> None:
        if self.actor is None:
            return
        seq, self._seq = self._seq, self._seq + 1
        try:
            self.actor.command.remote(seq, ww.encode(message))
        except Exception:  # noqa: BLE001 - a dead actor: its poll says so
            pass

    def kill(self) -> None:
        """Kill the actor; its poll ends by itself once the take in flight fails (RayCluster.aclose waits for it:
        a cancelled take's future is one Ray Client still sets, and says so loudly)."""
        if self.actor is not None:
            try:
                self.cluster.ray.kill(self.actor)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def stderr_tail(self) -> str:
        return self._error


class RayCluster:
    """This run's connection to Ray: the nodes, and the worker actors placed on them."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.ray: Any = None
        self.nodes: list[tuple[str, str]] = []  # (node id, a name to show: host and the id's start)
        self._actor_class: Any = None
        self._links: list[RayWorker] = []

    @property
    def count(self) -> int:
        return len(self.nodes) * self.cfg.workers_per_node

    def connect(self) -> int:
        """Join (or start) the cluster; returns how many workers the run gets. BadInput when it cannot."""
        ray = self.ray = import_ray()
        cluster = self.cfg.cluster or "ray"
        address = None if cluster == "ray" else cluster
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        if address is None and not os.environ.get("RAY_ADDRESS"):
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            kwargs["include_dashboard"] = False
        # ray.init sets its own SIGTERM handler (sys.exit): the run's own (an interrupted run's clean end) is kept.
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for attempt in range(1, CONNECT_TRIES + 1):
                try:
                    ray.init(address=address, **kwargs)
                    break
                except ConnectionAbortedError:
                    # Ray Client's proxy now and then fails to start this client's own server ("Starting Ray
                    # client server failed", seen about once in ten fresh clusters here): the next try starts another.
                    if attempt == CONNECT_TRIES:
                        raise
                    with contextlib.suppress(Exception):
                        ray.shutdown()  # whatever the failed try left
                    time.sleep(1.0)
        except Exception as e:  # noqa: BLE001 - unreachable, refused, the wrong version: one line
            text = " ".join(str(e).split())[:300]
            raise BadInput(f"--cluster {cluster}: cannot connect to Ray: {type(e).__name__}: {text}") from None
        finally:
            for s, h in handlers.items():
                if h is not None:
                    signal.signal(s, h)
        try:
            alive = [n for n in ray.nodes() if n.get("Alive")]
        except Exception as e:  # noqa: BLE001
            self.close()
            raise BadInput(f"--cluster {cluster}: cannot list the cluster's nodes: {e}") from None
        # The head first (where a local runtime is: this machine), then the rest in the order Ray lists them.
        alive.sort(key=lambda n: "node:__internal_head__" not in n.get("Resources", {}))
        for n in alive:
            host = n.get("NodeName") or n.get("NodeManagerAddress") or socket.gethostname()
            self.nodes.append((n["NodeID"], f"{host}/{n['NodeID'][:12]}"))
        if not self.nodes:
            self.close()
            raise BadInput(f"--cluster {cluster}: the cluster has no live node")
        self._actor_class = ray.remote(ShardActor)
        return self.count

    def placement(self, index: int) -> tuple[str, str]:
        """Worker `index`'s node: round the nodes, so the sessions (k-1 mod N) spread over them."""
        return self.nodes[index % len(self.nodes)]

    def actor(self, index: int, node_id: str, node: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            num_cpus=0,  # --workers-per-node places them, not the nodes' CPU counts
            max_concurrency=4,  # a take waits while commands come in
            max_restarts=0,  # a dead worker is lost (its turns recorded so), never silently restarted
        ).remote(index, node, buffer_bytes())

    def link(self, index: int) -> RayWorker:
        link = RayWorker(self, index)
        self._links.append(link)
        return link

    async def aclose(self) -> None:
        """Let the workers' polls end (their actors killed, each take in flight fails at once), then close."""
        polls = [w._poll for w in self._links if w._poll is not None and not w._poll.done()]
        if polls:
            _, late = await asyncio.wait(polls, timeout=5.0)
            for task in late:
                task.cancel()
        self.close()

    def close(self) -> None:
        """Disconnect; a runtime ray.init started here stops with it, someone's cluster never does."""
        if self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
