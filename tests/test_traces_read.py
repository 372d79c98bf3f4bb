"""Reading traces: each format's shipped test trace gives the sessions and turns it says, auto-detection tells
each format (gzip or not), bad input is one line naming the file and the row (or a counted skip), and the
reading streams: a request comes out before the file is read to its end, in memory far below the file's."""

from __future__ import annotations

import gzip
import json
import math
import tracemalloc
from pathlib import Path

import pytest

from rampwatch.drivers.model.trace import TraceRequest, collect_sessions
from rampwatch.drivers.model.trace_slice import TraceSlice
from rampwatch.drivers.run.config import BadInput
from rampwatch.drivers.run.trace_read import detect_format, open_trace
from tests import make_traces

TRACES = Path(__file__).resolve().parent / "data" / "traces"


def read(name: str | Path, **kw) -> list[TraceRequest]:
    pool = kw.pop("pool_tokens", None)
    cut = kw.pop("cut", None)
    return list(open_trace(TRACES / name if isinstance(name, str) else name, **kw).requests(cut, pool))


def shape(requests: list[TraceRequest]) -> dict[str, list[int]]:
    """Each session's input lengths, turn by turn."""
    return {s.id: [t.input_length for t in s.turns] for s in collect_sessions(requests)}


def test_the_shipped_traces_are_what_the_generator_writes():
    for name, data in make_traces.small_traces().items():
        assert (TRACES / name).read_bytes() == data, f"regenerate with: python tests/make_traces.py ({name})"


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("mooncake.jsonl", "mooncake"),
        ("bailian.csv", "bailian"),
        ("bailian.jsonl", "bailian"),
        ("agentic.jsonl.gz", "agentic"),
        ("aiperf.jsonl", "aiperf"),
        ("recording.jsonl", "rampwatch"),
    ],
)
def test_auto_detection_tells_each_format(name, fmt):
    assert detect_format(TRACES / name) == fmt
    assert open_trace(TRACES / name).format == fmt


def test_mooncake_sessions_share_leading_blocks_and_a_delay_follows_its_session():
    rs = read("mooncake.jsonl")
    assert shape(rs) == {
        "s1": [1700, 2600, 3900],
        "s2": [1500, 2300],
        "s3": [1800, 3000, 3300],
        "row4": [1300],
        "row8": [1300],
    }
    firsts = [r for r in rs if r.turn == 1]
    assert all(list(r.hash_ids[:2]) == [1, 2] for r in firsts)  # the shared system prompt: two 512-token blocks
    assert [r.ideal_cached for r in firsts] == [0, 1024, 1024, 1024, 1024]  # later sessions' turn 1 hit it
    s3 = [r for r in rs if r.session == "s3"]
    assert [r.due_s for r in s3] == [2.0, 8.0, 14.0]  # the third turn: its delay after the second


@pytest.mark.parametrize("name", ["bailian.csv", "bailian.jsonl"])
def test_bailian_chains_are_sessions_and_a_second_child_is_a_branch(name):
    rs = read(name)
    assert shape(rs) == {"1": [120, 260, 420], "10": [90, 200], "4": [380, 560]}
    branch = next(r for r in rs if r.session == "4" and r.turn == 1)
    assert (branch.forked_from, branch.fork_turn) == ("1", 2)
    assert branch.ideal_cached == 288  # chat 2's prompt and reply, to the last full 16-token block
    assert {r.kind for r in rs} == {"text", "image"}


def test_agentic_conversations_grow_to_200k_with_subagents_forked_off_their_prefix():
    rs = read("agentic.jsonl.gz")
    sessions = {s.id: s for s in collect_sessions(rs)}
    mains = [sessions[f"agent{c}"] for c in (1, 2, 3)]
    assert all(len(m.turns) == 6 and 195_000 < m.turns[-1].input_length < 201_000 for m in mains)
    subs = [s for s in sessions.values() if s.forked_from is not None]
    assert sorted(s.id for s in subs) == ["agent1/sub3", "agent1/sub6", "agent2/reviewer", "agent3/sub3", "agent3/sub6"]
    assert {s.id: s.fork_turn for s in subs}["agent1/sub6"] == 4  # after the main session's fourth request
    assert len(sessions["agent2/reviewer"].turns) == 2  # one agent, two requests
    # Every subagent finds its conversation's first 24K tokens (375 blocks of 64) already sent.
    assert all(s.turns[0].ideal_cached == 24_000 // 64 * 64 for s in subs)
    # The second and third conversations open with the first's 8K-token harness prompt.
    assert [m.turns[0].ideal_cached for m in mains] == [0, 8192, 8192]


def test_aiperf_turns_carry_their_sessions_history_and_their_gaps():
    rs = read("aiperf.jsonl")
    text = "Summarize the design document in three bullet points, then list its open questions."
    assert shape(rs) == {
        "chat-a": [300, 300 + 60 + 120, 480 + 60 + 200],
        "chat-b": [math.ceil(len(text) / 4), math.ceil(len(text) / 4) + 90 + 13],
        "chat-c": [800, 800 + 30 + 100],
    }
    assert [(r.session, r.due_s) for r in rs] == [
        ("chat-a", 0.0),
        ("chat-b", 1.5),
        ("chat-c", 2.5),
        ("chat-a", 4.0),
        ("chat-b", 4.5),
        ("chat-c", 9.0),
        ("chat-a", 11.0),
    ]
    assert next(r for r in rs if r.session == "chat-b").text == text


def test_a_recording_replays_its_sessions_sizes_and_send_times():
    rs = read("recording.jsonl")
    # s1's second turn failed once (its first TurnDone reported no sizes: its target) and was retried; s2's
    # last failed: its target.
    assert shape(rs) == {"s1": [1007, 2000, 4021], "s2": [1007, 2014, 4000]}
    assert [round(r.due_s, 1) for r in rs] == [0.0, 0.1, 5.0, 5.1, 10.0, 10.1]
    assert all(r.output_length == 64 for r in rs) and rs[-1].closes_session
    assert [r.ideal_cached for r in rs if r.session == "s1"] == [0, 1007 // 16 * 16, 2000 // 16 * 16]


def test_a_shipped_recording_reads_as_a_trace():
    rs = read(Path(__file__).resolve().parents[1] / "recordings" / "vllm-cpu-2x32k.sample.jsonl")
    assert {s.id: len(s.turns) for s in collect_sessions(rs)} == {"s1": 10, "s2": 10}


def test_a_whole_file_agentic_conversation_and_the_block_size_override(tmp_path):
    conversation = make_traces.agentic_conversations()[0]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(conversation, indent=2))
    assert detect_format(path) == "agentic"
    assert len(read(path)) == 8
    with pytest.raises(BadInput, match=r"one.json: line 1 \(request 1\): 375 hash ids for input_length 24000"):
        read(path, block_size=32)


def test_a_slice_and_a_pool_through_the_reading():
    trace = open_trace(TRACES / "mooncake.jsonl")
    rs = list(trace.requests(TraceSlice(max_context=3000, sessions=3), pool_tokens=2048))
    assert trace.skipped == {"over-max-context": 2, "past-sessions": 2}
    assert [r.session for r in rs] == ["s1", "s2", "s3", "s1", "s2", "s3"]
    # 4 blocks of 512: s2's and s3's turn 1 (their own blocks, replies included) take s1's third block before its turn 2
    assert [r.ideal_cached_pool for r in rs] == [0, 1024, 1024, 1024, 1024, 1024]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


MOONCAKE = '{"timestamp": %d, "input_length": %d, "output_length": 10, "hash_ids": %s}'


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (
            [MOONCAKE % (0, 600, "[1,2]"), MOONCAKE % (5, 600, "[1,2]"), MOONCAKE % (3, 600, "[1,2]")],
            "t.jsonl: line 3: due at 0.003 s, before an earlier row's 0.005 s; sort the rows by time",
        ),
        ([MOONCAKE % (0, 0, "[]")], "t.jsonl: line 1: input_length is 0"),
        (
            [MOONCAKE % (0, 600, "[1]")],
            "t.jsonl: line 1: 1 hash ids for input_length 600, which at 512 tokens a block needs 2; check --block-size",
        ),
        (
            [
                MOONCAKE % (0, 600, "[1,2]"),
                '{"chat_id": 4, "timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1]}',
            ],
            "t.jsonl: line 2: a Qwen-Bailian row (it has chat_id) in a Mooncake trace; a trace is one format",
        ),
        (
            [MOONCAKE % (0, 600, "[1,2]"), '{"timestamp": 1, "input_length": "many"}'],
            "t.jsonl: line 2: not a Mooncake row: Expected `int | null`, got `str` - at `$.input_length`",
        ),
        ([MOONCAKE % (0, 600, "[1,2]"), "{not json"], "t.jsonl: line 2: not JSON"),
        (
            [
                '{"chat_id": 1, "parent_chat_id": 9, "timestamp": 0, "input_length": 16, "output_length": 1, '
                '"hash_ids": [1]}'
            ],
            "t.jsonl: line 1: parent_chat_id 9 does not appear before this row; a parent comes before its children",
        ),
        (
            [
                '{"chat_id": 1, "parent_chat_id": 1, "timestamp": 0, "input_length": 16, "output_length": 1, '
                '"hash_ids": [1]}'
            ],
            "t.jsonl: line 1: chat_id 1 is its own parent",
        ),
        (
            [
                '{"session_id": "a", "turns": [{"input_length": 5, "output_length": 1, "timestamp": 9000}, '
                '{"input_length": 5, "output_length": 1, "timestamp": 2000}]}'
            ],
            "t.jsonl: line 1 (request 2): turn due at 2 s, before the previous turn at 9 s",
        ),
        (
            [
                '{"id": "c", "requests": [{"t": 0, "in": 64, "out": 1, "hash_ids": [1]}, '
                '{"t": 1, "in": 64, "out": -1, "hash_ids": [1]}]}'
            ],
            "t.jsonl: line 1 (request 2): output_length is -1",
        ),
        (
            [
                '{"id": "c", "requests": [{"t": 5, "in": 64, "out": 1, "hash_ids": [1]}, '
                '{"t": 1, "in": 64, "out": 1, "hash_ids": [1]}]}'
            ],
            "t.jsonl: line 1 (request 2): t 1 s comes after t 5 s; sort the requests by time",
        ),
    ],
    ids=[
        "order",
        "zero",
        "hash-ids",
        "mixed",
        "field",
        "json",
        "parent",
        "cycle",
        "aiperf-order",
        "agentic-length",
        "agentic-order",
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_the_row(tmp_path, lines, said):
    path = write(tmp_path / "t.jsonl", lines)
    with pytest.raises(BadInput) as e:
        read(path)
    message = str(e.value)
    assert message.startswith(str(tmp_path)) and said in message and "\n" not in message, message


def test_skip_bad_counts_each_reason_and_keeps_the_rest(tmp_path):
    path = write(
        tmp_path / "t.jsonl",
        [
            MOONCAKE % (5, 600, "[1,2]"),
            MOONCAKE % (6, 0, "[]"),
            MOONCAKE % (7, 600, "[1]"),
            "{torn",
            '{"chat_id": 4, "timestamp": 8, "input_length": 5, "output_length": 1, "hash_ids": [1]}',
            MOONCAKE % (1, 600, "[1,2]"),
            MOONCAKE % (9, 600, "[1,2]"),
        ],
    )
    trace = open_trace(path, skip_bad=True)
    assert [r.line for r in trace.requests()] == [1, 7]
    assert trace.skipped == {"length": 1, "hash-ids": 1, "field": 1, "format": 1, "order": 1}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "no such trace: "),
        ("", "empty file, not a trace"),
        ('{"prompt": "hello", "model": "x"}\n', "not a trace format rampwatch knows"),
        ("a,b,c\n1,2,3\n", "not a trace format rampwatch knows"),
    ],
    ids=["missing", "empty", "unknown-json", "unknown-csv"],
)
def test_a_file_that_is_no_trace_is_one_line(tmp_path, content, said):
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BadInput, match=said):
        open_trace(path)


def test_a_format_named_wrongly_says_what_the_rows_are(tmp_path):
    with pytest.raises(BadInput, match="bailian.jsonl: line 1: a Qwen-Bailian row .* in a Mooncake trace"):
        read("bailian.jsonl", fmt="mooncake")
    with pytest.raises(BadInput, match="not a Qwen-Bailian CSV header: no chat_id"):
        read(write(tmp_path / "t.csv", ["a,b", "1,2"]), fmt="bailian")
    with pytest.raises(BadInput, match="not a rampwatch recording"):
        read("mooncake.jsonl", fmt="rampwatch")


def test_the_reading_streams(tmp_path):
    """A request comes out before a bad row at the end is reached; and reading a trace of many one-turn rows that
    share their blocks holds a small fraction of the file in memory (the rows, not the file)."""
    good = MOONCAKE % (0, 600, "[1,2]")
    path = write(tmp_path / "t.jsonl", [good] * 3 + ["{torn"])
    requests = open_trace(path).requests()
    assert next(requests).line == 1
    ids = json.dumps(list(range(40)))
    big = tmp_path / "big.jsonl.gz"
    with gzip.open(big, "wt") as f:
        for k in range(20_000):
            f.write(MOONCAKE % (k, 40 * 512, ids) + "\n")
    size = sum(len(MOONCAKE % (k, 40 * 512, ids)) + 1 for k in range(20_000))
    tracemalloc.start()
    try:
        assert sum(1 for _ in open_trace(big).requests(pool_tokens=10_000)) == 20_000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 20, (peak, size)
