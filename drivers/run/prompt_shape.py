"""How a run's prompts are shaped beyond salted pseudo-words: --system-prompt, --shared-prefix, --corpus and
--think-time checked before anything starts, and the shared lead built once the server's tokenizer is known."""

from __future__ import annotations

import random
from pathlib import Path

import httpx

from rampwatch.drivers.client.prompts import Corpus, CorpusError, CorpusReader, Lead, read_corpus, text_sha256
from rampwatch.drivers.client.ramp import Calibration, Filler, ScheduleError, TextSource, parse_tokens
from rampwatch.drivers.client.request_options import text_or_file
from rampwatch.drivers.client.tokenizer import ServerTokenizer, over_httpx
from rampwatch.drivers.model import events as ev
from rampwatch.drivers.run.config import BadInput, RunConfig, parse_duration

LEAD_SAMPLE_SEED = 7  # the text the lead's tokens are measured against: any text, the same every run
LEAD_SAMPLE_CHARS = 2_000
FIT_ROUNDS = 8  # /tokenize rounds that bring the shared block to its size (each one a character-level correction)


def load_system_prompt(spec: str | None) -> str | None:
    """--system-prompt TEXT, or @FILE for a file's text."""
    if spec is None:
        return None
    try:
        text = text_or_file(spec)
    except ValueError as e:
        raise BadInput(f"--system-prompt {e}") from None
    if not text.strip():
        raise BadInput(f"--system-prompt {spec!r}: empty")
    return text


def shared_prefix_size(text: str | None) -> int:
    """--shared-prefix TOKENS ('8k', '2000'); 0 without one."""
    if text is None:
        return 0
    try:
        return parse_tokens(text)
    except ScheduleError as e:
        raise BadInput(f"--shared-prefix: {e}") from None


def parse_think_time(text: str | None) -> tuple[float, float] | None:
    """--think-time S or a range 'A..B' (e.g. 12s, 5s..30s, 0s..30s): seconds, as (low, high). A range may start
    at zero (some users answer at once); a pause of zero alone (0s, 0s..0s) is no pause, as without the flag."""
    if text is None:
        return None
    low, dots, high = text.partition("..")
    if not dots:
        low = high = text
    try:
        span = (parse_duration(low, zero=True), parse_duration(high, zero=True))
    except BadInput as e:
        raise BadInput(f"--think-time: {e}") from None
    if span[1] < span[0]:
        raise BadInput(f"--think-time {text!r}: the range must go from the shorter pause to the longer (e.g. 5s..30s)")
    return span if span[1] > 0 else None


def check_corpus_path(path: Path | None) -> None:
    """A --corpus path that is not there, found before anything starts (its text is read by the run)."""
    if path is not None and not path.exists():
        raise BadInput(f"--corpus {path}: no such file or directory")


def load_corpus(path: Path | None) -> Corpus | None:
    if path is None:
        return None
    try:
        return read_corpus(path)
    except CorpusError as e:
        raise BadInput(str(e)) from None


def corpus_offset(corpus: Corpus, salt: str, slot: int, slots: int) -> int:
    """Where slot `slot` of `slots` (0: the shared block, k: session k) starts reading: spread evenly from
    a place the run's salt picks, so sessions read different text and runs start in different places."""
    size = len(corpus.text)
    return (random.Random(salt).randrange(size) + slot * size // slots) % size


def corpus_reader(corpus: Corpus | None, salt: str, slot: int, slots: int) -> CorpusReader | None:
    """Slot `slot`'s reader of the corpus (see corpus_offset); None without --corpus."""
    return CorpusReader(corpus, corpus_offset(corpus, salt, slot, slots)) if corpus is not None else None


async def build_lead(
    tok: ServerTokenizer | None, cal: Calibration, system: str | None, shared_tokens: int, source: TextSource
) -> Lead:
    """The lead every session opens with: the system message and a shared block of `shared_tokens` tokens
    from `source` (fitted by the server's count when it has /tokenize), and what both add to turn 1."""
    shared = source.text(round(shared_tokens * cal.chars_per_token)) if shared_tokens else ""
    counted = await tok.text(shared) if shared and tok is not None else None
    for _ in range(FIT_ROUNDS):
        if counted is None or counted == shared_tokens or tok is None:
            break
        off = shared_tokens - counted
        # Far off: the ratio's guess; a token or two off, one character at a time (a guess of 3 characters
        # can step over the size both ways, forever).
        chars = round(off * cal.chars_per_token) if abs(off) > 2 else (1 if off > 0 else -1)
        shared = shared + source.text(chars) if chars > 0 else shared[: len(shared) + chars]
        counted = await tok.text(shared)
    if system is None and not shared:
        return Lead()
    lead = Lead(system=system, shared=shared, shared_tokens=counted)
    sample = Filler(random.Random(LEAD_SAMPLE_SEED)).text(LEAD_SAMPLE_CHARS)
    if tok is not None:
        with_lead, without = await tok.prompt(lead.opening() + sample, system), await tok.prompt(sample)
        if with_lead and without:
            return Lead(system=system, shared=shared, tokens=with_lead - without, shared_tokens=counted)
    # No /tokenize: the text's size by the ratio, and a system message's template like a user message's.
    estimate = round(len(lead.opening()) / cal.chars_per_token)
    if system is not None:
        estimate += round(len(system) / cal.chars_per_token) + cal.template_tokens
    return Lead(system=system, shared=shared, tokens=estimate, shared_tokens=counted)


def check_lead_fits(cfg: RunConfig, lead: Lead, cal: Calibration) -> None:
    """The first turn must hold the shared lead and still have room for its own text."""
    own = cal.template_tokens + (cal.fixed_tokens[0] if cal.fixed_tokens else 64)
    if lead.tokens and cfg.schedule[0] < lead.tokens + own + 16:
        raise BadInput(
            f"the first turn ({cfg.schedule[0]:,} tokens) cannot hold the shared lead ({lead.tokens:,} tokens of "
            "--system-prompt and --shared-prefix) and its own text: grow the --schedule or shrink the lead"
        )


async def shared_lead(
    client: httpx.AsyncClient, cfg: RunConfig, model: str, cal: Calibration, corpus: Corpus | None, salt: str
) -> Lead:
    """The run's lead, built and checked: the shared block is read from the corpus (its slot 0) when there
    is one, else drawn from salted pseudo-words."""
    tok = (
        ServerTokenizer(over_httpx(client, cfg.base_url, cfg.headers()), model, cal.tokenize_field, cal.special_tokens)
        if cal.tokenize_field
        else None
    )
    source: TextSource = corpus_reader(corpus, salt, 0, cfg.sessions + 1) or Filler(random.Random(f"{salt}-shared"))
    lead = await build_lead(tok, cal, cfg.system_prompt, cfg.shared_prefix, source)
    check_lead_fits(cfg, lead, cal)
    return lead


def prompt_shape(cfg: RunConfig, lead: Lead, corpus: Corpus | None) -> ev.PromptShape | None:
    """What the header records of the run's prompts: sizes and hashes (the system prompt's text only with
    --record-text)."""
    system = cfg.system_prompt
    if system is None and not cfg.shared_prefix and corpus is None and cfg.think_time is None:
        return None
    return ev.PromptShape(
        system_prompt_chars=len(system) if system else 0,
        system_prompt_sha256=text_sha256(system) if system else "",
        system_prompt=system if system and cfg.record_text else None,
        shared_prefix_tokens=cfg.shared_prefix,
        shared_prefix_measured=lead.shared_tokens,
        lead_tokens=lead.tokens,
        corpus=corpus.path if corpus else "",
        corpus_files=corpus.files if corpus else 0,
        corpus_chars=len(corpus.text) if corpus else 0,
        corpus_sha256=corpus.sha256 if corpus else "",
        think_time_s=cfg.think_time,
    )
