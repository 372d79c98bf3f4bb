"""Recording round trip, killed-run tolerance and clear errors."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.recording import Recorder, RecordingError, read_recording
from tests.test_state_analysis import header, two_session_run


def write(path: Path, events: list[ev.AnyEvent]) -> None:
    rec = Recorder(path, header())
    for e in events:
        rec.write(e)
    rec.close()


def test_round_trip(tmp_path):
    events = two_session_run()
    write(tmp_path / "r.jsonl", events)
    back = read_recording(tmp_path / "r.jsonl")
    assert back.header == header()
    assert back.events == events and not back.truncated_tail


def test_refuses_to_clobber_and_checks_paths(tmp_path):
    write(tmp_path / "r.jsonl", [])
    with pytest.raises(FileExistsError):
        Recorder(tmp_path / "r.jsonl", header())
    assert "directory" in Recorder.check_path(tmp_path)
    assert "already exists" in Recorder.check_path(tmp_path / "r.jsonl")
    assert "does not exist" in Recorder.check_path(tmp_path / "nope" / "x.jsonl")
    assert Recorder.check_path(tmp_path / "new.jsonl") is None


def test_truncated_last_line_is_tolerated(tmp_path):
    events = two_session_run()
    write(tmp_path / "r.jsonl", events)
    data = (tmp_path / "r.jsonl").read_bytes()
    for cut in range(len(data) - 1, len(data) - 200, -7):
        (tmp_path / "cut.jsonl").write_bytes(data[:cut])
        back = read_recording(tmp_path / "cut.jsonl")
        assert back.events == events[: len(back.events)]
        assert len(back.events) >= len(events) - 2


def test_corrupt_middle_line_names_the_line(tmp_path):
    write(tmp_path / "r.jsonl", two_session_run())
    lines = (tmp_path / "r.jsonl").read_bytes().split(b"\n")
    lines[4] = b'{"type":"TokenTimes","t":'
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(RecordingError, match=r"bad.jsonl:5: corrupt line.*--skip-bad-lines"):
        read_recording(tmp_path / "bad.jsonl")
    back = read_recording(tmp_path / "bad.jsonl", skip_bad_lines=True)
    assert back.skipped_lines == [5] and len(back.events) == len(two_session_run()) - 1


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "empty file"),
        (b"hello world\n", "not a rampwatch recording"),
        (b'{"type":"SessionPlanned","t":0}\n', "not a rampwatch recording"),
        (
            b'{"type":"header","schema":99,"rampwatch_version":"9","command":[],"mode":"run","server":"s"}\n',
            "schema 99",
        ),
    ],
)
def test_rejects_non_recordings(tmp_path, content, message):
    (tmp_path / "x").write_bytes(content)
    with pytest.raises(RecordingError, match=message):
        read_recording(tmp_path / "x")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(RecordingError, match="no such recording"):
        read_recording(tmp_path / "missing.jsonl")
    with pytest.raises(RecordingError, match="directory"):
        read_recording(tmp_path)


def test_flushes_without_close(tmp_path):
    rec = Recorder(tmp_path / "r.jsonl", header())
    rec.FLUSH_EVERY = 0.0
    rec.write(ev.Mark(t=1.0, note="x"))
    back = read_recording(tmp_path / "r.jsonl")  # the file is still open: a killed run looks like this
    assert back.events == [ev.Mark(t=1.0, note="x")]
    rec.close()


class FlakyDisk:
    """The real file, but while `full` each write lands half its bytes, then fails with ENOSPC."""

    def __init__(self, f):
        self.f, self.full = f, False

    def write(self, data):
        if self.full:
            self.f.write(bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_disk_full_keeps_lines_and_resumes_without_a_torn_line(tmp_path):
    rec = Recorder(tmp_path / "r.jsonl", header())
    disk = rec._file = FlakyDisk(rec._file)
    rec.write(ev.Mark(t=1.0, note="before"))
    rec.flush()
    disk.full = True
    rec.write(ev.Mark(t=2.0, note="during"))
    rec.flush()
    assert rec.error and "No space left" in rec.error
    rec.write(ev.Mark(t=3.0, note="still full"))  # no exception: the run goes on
    rec.flush()  # inside the retry interval: not even tried
    assert read_recording(tmp_path / "r.jsonl").events == [ev.Mark(t=1.0, note="before")]
    disk.full = False
    rec.close()  # the last try writes everything that waited
    assert rec.error is None and rec.resumed == 1
    assert [e.note for e in read_recording(tmp_path / "r.jsonl").events] == ["before", "during", "still full"]


def test_header_has_no_secret_fields():
    fields = set(ev.Header.__struct_fields__)
    assert not fields & {"api_key", "authorization", "headers"}
    assert msgspec.json.decode(msgspec.json.encode(header()))["type"] == "header"


def test_a_hub_without_state_stamps_its_recording_notices_with_the_newest_event(tmp_path):
    """The driver process folds no state; a full disk found by a forced flush is still said at the right time."""
    from rampwatch.drivers.run.hub import EventHub
    from tests.faults import FlakyFile

    rec = Recorder(tmp_path / "r.jsonl", ev.Header(rampwatch_version="0", command=[], mode="run", server="s"))
    hub = EventHub(None, recorder=rec, keep_events=True)
    hub.emit(ev.Mark(t=5.0, note="before"))
    rec._file = FlakyFile(rec._file, full=True)
    hub.flush(force=True)
    notice = hub.events[-1]
    assert isinstance(notice, ev.Notice) and notice.topic == "recording" and notice.t == 5.0
