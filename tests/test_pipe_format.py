"""A line the UI cannot read from the driver's stream is said on screen, never dropped in silence (issue 21): if
the two sides ever disagree on the format, the UI shows why it shows nothing."""

from __future__ import annotations

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.run.config import RunConfig
from rampwatch.drivers.run.pipe import encode
from rampwatch.drivers.run.process import DriverProcess


def fed(*lines: bytes) -> DriverProcess:
    driver = DriverProcess(RunConfig(url="http://127.0.0.1:9"), record=False)
    driver.state = RunState()
    driver._splitter.feed(b"".join(line + b"\n" for line in lines))
    return driver


def test_an_unreadable_line_becomes_one_notice_and_the_next_event_still_applies():
    good = encode(ev.Mark(t=1.5, note="after"))
    driver = fed(b'{"type":"EventFromAFutureVersion","t":1.0}', good)
    messages = [e.text for e in driver.state.log]
    assert any("could not read a line of the driver's stream" in m for m in messages), messages
    assert any("after" in m for m in messages)  # the stream goes on


def test_unreadable_lines_are_counted_not_repeated():
    driver = fed(*[b"not json at all"] * 12, encode(ev.Mark(t=2.0, note="ok")))
    notices = [e.text for e in driver.state.log if "could not read" in e.text]
    assert len(notices) == 2 and "10 lines" in notices[1]


def test_lines_it_reads_raise_no_notice():
    driver = fed(encode(ev.Mark(t=1.0, note="a")), encode(ev.Mark(t=2.0, note="b")))
    assert not [e for e in driver.state.log if "could not read" in e.text]
    assert [e.text for e in driver.state.log] == ["mark: a", "mark: b"]
