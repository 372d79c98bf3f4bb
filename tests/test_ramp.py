from __future__ import annotations

import random
import re

import msgspec
import pytest

from rampwatch.drivers.client.prompts import Corpus, CorpusReader
from rampwatch.drivers.client.ramp import (
    SEED_SCHEDULE,
    Calibration,
    Conversation,
    ConversationState,
    Filler,
    ScheduleError,
    parse_schedule,
    parse_tokens,
    scale_schedule,
)
from rampwatch.drivers.present.format import format_tokens


def test_seed_schedule_is_the_ten_turn_ramp():
    assert SEED_SCHEDULE == [32768, 65536, 131072, 262144, 393216, 524288, 655360, 786432, 917504, 1_000_000]
    assert parse_schedule("seed") == SEED_SCHEDULE


@pytest.mark.parametrize(
    "text,value", [("32k", 32768), ("128K", 131072), ("1m", 1_000_000), ("5000", 5000), (" 2k ", 2048)]
)
def test_parse_tokens(text, value):
    assert parse_tokens(text) == value


@pytest.mark.parametrize("text", ["", "abc", "32x", "-5", "0", "1.5.5k"])
def test_parse_tokens_rejects(text):
    with pytest.raises(ScheduleError):
        parse_tokens(text)


def test_parse_schedule_list_and_errors():
    assert parse_schedule("32k,64k,128k,1m") == [32768, 65536, 131072, 1_000_000]
    with pytest.raises(ScheduleError, match="grow"):
        parse_schedule("64k,32k")
    with pytest.raises(ScheduleError):
        parse_schedule(",")


def test_scale_keeps_shape_and_ends_on_target():
    scaled = scale_schedule(SEED_SCHEDULE, 32768)
    assert scaled[-1] == 32768 and len(scaled) == 10
    for a, b in zip(SEED_SCHEDULE, scaled):
        assert b == pytest.approx(a * 32768 / 1_000_000, abs=1)
    with pytest.raises(ScheduleError, match="too small"):
        scale_schedule(SEED_SCHEDULE, 5)


def test_format_tokens():
    assert format_tokens(1_000_000) == "1M"
    assert format_tokens(131072) == "131K"
    assert format_tokens(2100) == "2.1K"
    assert format_tokens(None) == "-"


def test_filler_never_repeats_a_block_and_is_salted():
    a = Filler(random.Random("run-a")).text(200_000)
    b = Filler(random.Random("run-b")).text(200_000)
    assert abs(len(a) - 200_000) < 50
    assert a[:1000] != b[:1000]
    # No 200-char block of the text appears twice.
    blocks = {a[i : i + 200] for i in range(0, len(a) - 200, 200)}
    assert len(blocks) == len(range(0, len(a) - 200, 200))


def _message(conv: Conversation, turn: int) -> str:
    chars, _ = conv.plan(turn)
    return "".join(conv.user_message(turn, chars))


def test_needle_planted_in_turn_one_and_asked_every_turn():
    conv = Conversation("salt1", [1000, 2000, 3000])
    first = _message(conv, 1)
    assert first.startswith("[salt1] ")
    assert conv.needle.fact() in first and first.endswith(conv.needle.question())
    conv.add_reply(prompt_tokens=1000, completion_tokens=10)
    second = _message(conv, 2)
    assert conv.needle.fact() not in second and second.endswith(conv.needle.question())
    assert conv.needle.found_in(f"it is {conv.needle.value.lower()}.")
    assert not conv.needle.found_in("no idea")


def test_needles_differ_between_sessions():
    a, b = Conversation("r-s1", [100]), Conversation("r-s2", [100])
    assert (a.needle.key, a.needle.value) != (b.needle.key, b.needle.value)


def test_budget_corrects_the_ratio_from_usage():
    cal = Calibration(chars_per_token=4.0, template_tokens=8, fixed_tokens=(50, 20))
    conv = Conversation("x", [10_000, 20_000], cal)
    chars1, new1 = conv.plan(1)
    assert new1 == 10_000 and chars1 == (10_000 - 8 - 50) * 4
    _message(conv, 1)
    # The server saw 3 filler chars a token: turn 2 must be budgeted with that ratio.
    reported = round(chars1 / 3.0) + 8 + 50
    conv.add_reply(prompt_tokens=reported, completion_tokens=100)
    assert conv.chars_per_token == pytest.approx(3.0, rel=0.01)
    chars2, new2 = conv.plan(2)
    assert new2 == 20_000 - reported - 100
    assert chars2 == pytest.approx((new2 - 8 - 20) * 3.0, rel=0.01)


def _byte_bpe_tokens(text: str) -> int:
    """The tiny GGUF's tokenizer (tests/make_tiny_gguf.py): a token a byte, a space merged with the lowercase
    letter after it. Names and codes (capitals) cost a token a character: one session's needle is not another's."""
    return len(text.encode()) - len(re.findall(r" [a-z]", text))


def test_turn_one_lands_on_target_with_each_sessions_own_fixed_text():
    schedule = scale_schedule(SEED_SCHEDULE, 15 * 1024)  # turn 1: 503 tokens, none of it correctable by usage
    sample = Filler(random.Random(7)).text(20_000)
    probe = Conversation("0123456789ab-s1", schedule)
    probed = Calibration(
        chars_per_token=len(sample) / _byte_bpe_tokens(sample),
        template_tokens=0,
        fixed_tokens=(_byte_bpe_tokens(probe.fixed_text(1)), _byte_bpe_tokens(probe.fixed_text(2))),
    )

    def turn_one_error(conv: Conversation) -> float:
        return abs(_byte_bpe_tokens(_message(conv, 1)) / schedule[0] - 1)

    own, probes = [], []
    for k in range(2, 202):
        conv = Conversation(f"0123456789ab-s{k}", schedule, probed)
        probes.append(turn_one_error(conv))
        conv = Conversation(f"0123456789ab-s{k}", schedule, probed)
        conv.measured_fixed(_byte_bpe_tokens(conv.fixed_text(1)), _byte_bpe_tokens(conv.fixed_text(2)))
        own.append(turn_one_error(conv))
    # The probe session's fixed text put some sessions' first turn more than 2% off; their own never does.
    assert max(probes) > 0.02 and max(own) < 0.02, (max(probes), max(own))


def test_turn_one_is_fitted_to_the_servers_count():
    """Turn 1 is the whole prompt and has no usage to correct it: the server counts it before it goes, and
    its filler is extended or trimmed to the character by the difference."""
    schedule = scale_schedule(SEED_SCHEDULE, 15 * 1024)  # turn 1: 503 tokens
    template = 19  # the tiny GGUF's ChatML around one user message

    def prompt_tokens(content: str) -> int:
        return template + _byte_bpe_tokens(content)

    sample = Filler(random.Random(7)).text(20_000)
    cal = Calibration(chars_per_token=len(sample) / _byte_bpe_tokens(sample), template_tokens=template)
    drawn, fitted = [], []
    for k in range(200):
        conv = Conversation(f"0123456789ab-s{k}", schedule, cal)
        conv.measured_fixed(_byte_bpe_tokens(conv.fixed_text(1)), _byte_bpe_tokens(conv.fixed_text(2)))
        pieces = list(conv.user_message(1, conv.plan(1)[0]))
        drawn.append(prompt_tokens("".join(pieces)) - schedule[0])
        message = "".join(conv.fit_turn(1, pieces, prompt_tokens("".join(pieces))))
        fitted.append(prompt_tokens(message) - schedule[0])
        # What usage corrects the ratio with from turn 2 on: the filler characters actually sent.
        assert conv._pending == (1, len(message) - len(conv.fixed_text(1)))
    assert max(map(abs, drawn)) > 5 and max(map(abs, fitted)) <= 2, (sorted(drawn), sorted(fitted))


def test_million_token_turn_comes_in_slices():
    # Build time is measured by tests/bench_client.py; here: size and slicing.
    conv = Conversation("big", [1_000_000])
    chars, _ = conv.plan(1)
    pieces = list(conv.user_message(1, chars))
    assert sum(map(len, pieces)) == pytest.approx(4_000_000, rel=0.01)
    assert max(map(len, pieces)) <= Conversation.PIECE_CHARS + 1


@pytest.mark.parametrize("corpus", [False, True], ids=["pseudo-words", "corpus"])
def test_a_conversation_resumed_elsewhere_goes_on_as_it_would_have(corpus):
    """--workers-restart: a copy of the conversation made afresh and given state() after turn 2 sends the same
    turn 3 as the original, text and budget alike."""

    def made() -> Conversation:
        text = " ".join(f"word{i}" for i in range(20_000))  # no stretch repeats: a wrong place shows
        source = CorpusReader(Corpus(path="c", text=text, files=1), 77) if corpus else None
        return Conversation("resume-salt", [2048, 4096, 8192], source=source)

    original = made()
    for turn, prompt in ((1, 2050), (2, 4100)):
        filler, _ = original.plan(turn)
        "".join(original.user_message(turn, filler))
        original.add_reply(prompt, 40)
    copy = made()
    copy.resume(msgspec.json.decode(msgspec.json.encode(original.state()), type=ConversationState))
    assert copy.plan(3) == original.plan(3)
    filler, _ = original.plan(3)
    assert "".join(copy.user_message(3, filler)) == "".join(original.user_message(3, filler))


def test_a_resumed_conversation_draws_past_a_lost_turns_text():
    """A turn lost in flight drew its text after the state its worker kept: the copy that goes on skips that
    draw (skip), so the next turn's text is new, not what the server may have cached of the lost request."""
    original = Conversation("resume-salt", [2048, 4096, 8192])
    "".join(original.user_message(1, original.plan(1)[0]))
    original.add_reply(2050, 40)
    kept = original.state()
    lost = "".join(original.user_message(2, original.plan(2)[0]))
    head = lost[:80]

    def next_text(skip: bool) -> str:
        copy = Conversation("resume-salt", [2048, 4096, 8192])
        copy.resume(kept)
        if skip:
            copy.skip(2)
        return "".join(copy.user_message(3, copy.plan(3)[0]))

    assert next_text(skip=False).startswith(head)  # without the skip it would send the lost turn's text again
    assert head not in next_text(skip=True)
