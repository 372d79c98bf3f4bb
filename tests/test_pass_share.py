"""Many sessions' steps let go at once take turns over the driver loop's passes (drivers/net/pass_share.py): no
pass runs them past the 5 ms that marks a turn client busy, none is lost or reordered, and a cancelled one
holds up none."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from rampwatch.drivers.model.events import CLIENT_BUSY_S
from rampwatch.drivers.net.pass_share import SHARE_S, take_turn
from rampwatch.drivers.run import event_loop

STEP_S = 0.0005  # a session's step: about what building a 2,000-token turn's text costs


def spin(seconds: float) -> None:
    """Work for `seconds` of CPU (not wall time: another process taking the core does not lengthen the step)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_steps_let_go_together_spread_over_passes_in_order():
    """200 steps of 0.5 ms made ready in one pass (a barrier letting 200 sessions go): 100 ms in one pass
    without the share; with it, no pass runs more than a few, and they run in the order they came."""
    ran: dict[float, float] = defaultdict(float)  # the pass (its wake) -> the steps' CPU in it
    order: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate = loop.create_future()

        async def session(k: int) -> None:
            await gate
            await take_turn()
            start = time.process_time()
            spin(STEP_S)
            ran[loop.passes.woke] += time.process_time() - start  # type: ignore[attr-defined]
            order.append(k)

        tasks = [asyncio.create_task(session(k)) for k in range(200)]
        await asyncio.sleep(0.01)
        gate.set_result(None)
        await asyncio.gather(*tasks)

    event_loop.run(main())
    assert order == list(range(200))
    assert len(ran) >= 200 * STEP_S / (2 * SHARE_S)  # spread: at most about twice the share a pass
    assert max(ran.values()) < CLIENT_BUSY_S, sorted(ran.values())[-5:]


def test_a_cancelled_waiting_step_holds_up_none_and_a_plain_loop_never_waits():
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        done: list[int] = []

        async def session(k: int) -> None:
            await take_turn()
            spin(STEP_S)
            done.append(k)

        tasks = [asyncio.create_task(session(k)) for k in range(40)]
        await asyncio.sleep(0)  # they all start in the next pass: the first few run (2 ms), the rest wait
        assert loop.share.waiting > 0  # type: ignore[attr-defined]
        for t in tasks[10:20]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert loop.share.waiting == 0  # type: ignore[attr-defined]
        return done

    done = event_loop.run(main())
    assert done == [k for k in range(40) if not 10 <= k < 20]  # the cancelled never ran; the rest in order

    async def plain() -> float:  # not the driver's loop: a step goes on at once, however long the pass has run
        spin(3 * SHARE_S)
        start = time.perf_counter()
        await take_turn()
        return time.perf_counter() - start

    assert asyncio.run(plain()) < SHARE_S
