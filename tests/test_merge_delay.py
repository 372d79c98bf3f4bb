"""The coordinator's hold on the workers' events (drivers/run/merge_delay.py): HOLD_S while their lines come in
on time, as long as their lateness while the coordinator is behind (so one worker's events are not released
before another's older ones), back once they come in on time, and never past MAX_HOLD_S."""

from __future__ import annotations

import pytest

from rampwatch.drivers.run.merge_delay import HOLD_S, MAX_HOLD_S, WINDOW_S, MergeDelay


def test_lines_on_time_are_held_the_least():
    delay = MergeDelay()
    for k in range(50):
        delay.note(0.03, k * 0.1)
    assert delay.hold_s(5.0) == HOLD_S


def test_late_lines_lengthen_the_hold_until_lines_come_on_time_again():
    delay = MergeDelay()
    delay.note(3.0, 10.0)  # a coordinator reading a backlog: an event three seconds old
    assert delay.hold_s(10.1) == pytest.approx(3.0 + HOLD_S / 2)
    delay.note(0.02, 10.5 + WINDOW_S)  # the next window: on time, but the late one is still in view
    assert delay.hold_s(10.6 + WINDOW_S) == pytest.approx(3.0 + HOLD_S / 2)
    delay.note(0.02, 10.5 + 2 * WINDOW_S)  # two windows on: it is forgotten
    assert delay.hold_s(10.6 + 2 * WINDOW_S) == HOLD_S


def test_a_quiet_spell_forgets_the_lateness_before_it():
    delay = MergeDelay()
    delay.note(2.0, 1.0)
    assert delay.hold_s(1.0 + 5 * WINDOW_S) == HOLD_S


def test_the_hold_is_capped():
    delay = MergeDelay()
    delay.note(60.0, 100.0)
    assert delay.hold_s(100.0) == MAX_HOLD_S
