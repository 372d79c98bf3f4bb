"""The server panel: KV cache, prefix hit rate, requests, throughput, preemptions; with several
endpoints, one row each and their total."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group
from rich.text import Text

from rampwatch.drivers.model import panels
from rampwatch.drivers.model.endpoints import EndpointView, ServerView
from rampwatch.drivers.model.state import RunState
from rampwatch.drivers.present.turn_text import engine_timing_hint
from rampwatch.tui.fmt import bar, format_tokens, pct, rate, sparkline, whole
from rampwatch.tui.widgets.base import Panel

# What makes each engine put cached tokens in a response's usage.
CACHE_REPORT_FLAGS = {
    "vllm": "vLLM: --enable-prompt-tokens-details",
    "sglang": "SGLang: --enable-cache-report",
    "llama.cpp": "llama.cpp: a build with prompt_tokens_details",
}


class ServerPanel(Panel):
    """KV cache, prefix hit rate, requests, throughput, preemptions; an unexposed metric says why."""

    def render_state(self, state: RunState, now: float) -> object:
        srv = state.server
        v, missing = srv.values, srv.missing
        answered = [ep for ep in state.endpoints.values() if ep.last_sample_t is not None]
        rows = {ep.name for ep in answered} if len(answered) > 1 and not self.compact else set()  # say it in their row
        lines = [
            Text(f"metrics {src}: {err}", style="bold red")
            for src, err in panels.metrics_errors(state).items()
            if src not in rows
        ]
        if srv.last_sample_t is None:
            lines.append(Text("waiting for the first /metrics scrape…", style="dim"))
            return Group(*lines)
        width = max(8, self.size.width - 30)

        def why(field: str) -> Text:
            return Text(f"unavailable: {missing.get(field, 'not exposed')}", style="dim italic")

        last_hit = panels.last_turn_hit_rate(state)
        if self.compact:
            worst = self._worst(answered) if len(answered) > 1 else []
            return Group(*lines, *self._compact(state, last_hit), *worst)
        kv = v.get("kv_usage")
        line = Text("KV cache ", style="bold")
        if kv is None:
            line.append_text(why("kv_usage"))
        else:
            line.append_text(bar(kv, width, "red" if kv > 0.9 else "green"))
            line.append(f" {pct(kv)} (peak {pct(srv.kv_peak)})")
        lines.append(line)
        history = [x for _, x in list(srv.kv_history)[-width:]]
        if history:
            lines.append(Text("  history ", style="dim") + sparkline(history, 1.0, style="green")[0])
        cap = v.get("kv_capacity_tokens")
        fits = panels.kv_fits(state)
        line = Text("capacity ", style="bold")
        if cap is None:
            line.append_text(why("kv_capacity_tokens"))
        else:
            line.append(f"{format_tokens(cap)} tokens")
            if fits is not None:
                line.append(f" · fits {fits}× longest")
        lines.append(line)
        line = Text("prefix hit ", style="bold")
        if "prefix_hits" not in v and last_hit is None:
            line.append_text(why("prefix_hits"))
        else:
            line.append(f"last turn {pct(last_hit)} · since start {pct(panels.hit_rate_since_start(state))}")
        lines.append(line)
        # Last, under the live figures: a short panel crops this hint, never the requests or preemptions.
        untimed = panels.engine_timing_missing(state)
        hint = [Text(f"  {engine_timing_hint(panels.engine_name(state))}", style="dim italic")] if untimed else []
        if len(answered) > 1:  # one row per endpoint and the total: requests, rates and preemptions are there
            return Group(*lines, *endpoint_table(state, answered, self.size.width), *hint)
        if state.sessions and state.usage_has_cache is False:
            flag = CACHE_REPORT_FLAGS.get(srv.engine or "", "vLLM: --enable-prompt-tokens-details")
            lines.append(Text(f"  per-request cached tokens unavailable ({flag})", style="dim italic"))
        if (spans := spans_text(state)) is not None:
            lines.append(spans)
        line = Text("requests ", style="bold")
        line.append(f"running {whole(v.get('running'))} · waiting {whole(v.get('waiting'))}")
        lines.append(line)
        line = Text("throughput ", style="bold")
        line.append(f"prefill {rate(srv.prefill_rate)} · decode {rate(srv.decode_rate)} tok/s")
        lines.append(line)
        spec = spec_line(v, srv.decode_rate)
        if spec is not None:
            lines.append(spec)
        pre = panels.preemptions_this_run(state)
        line = Text("preemptions ", style="bold")
        if pre is None:
            line.append_text(why("preemptions"))
        else:
            line.append(f"{pre:.0f} this run", style="bold red" if pre > 0 else "")
        lines.append(line)
        return Group(*lines, *hint)

    def _compact(self, state: RunState, last_hit: float | None) -> list[Text]:
        """Two lines: KV, capacity and hit rate; requests, throughput, preemptions."""
        srv = state.server
        v = srv.values
        kv = v.get("kv_usage")
        one = Text("KV ", style="bold")
        if kv is None:
            one.append("unavailable", style="dim italic")
        else:
            one.append_text(bar(kv, 12, "red" if kv > 0.9 else "green"))
            one.append(f" {pct(kv)} peak {pct(srv.kv_peak)}")
        fits = panels.kv_fits(state)
        if fits is not None:
            one.append(f" · fits {fits}×")
        one.append(" · hit ", style="bold")
        one.append(f"{pct(last_hit)} last, {pct(panels.hit_rate_since_start(state))} run")
        two = Text("req ", style="bold")
        two.append(f"{whole(v.get('running'))} run {whole(v.get('waiting'))} wait")
        two.append(" · tok/s ", style="bold")
        two.append(f"prefill {rate(srv.prefill_rate)} decode {rate(srv.decode_rate)}")
        pre = panels.preemptions_this_run(state)
        two.append(" · preempt ", style="bold")
        two.append("-" if pre is None else f"{pre:.0f}")
        return [one, two]

    @staticmethod
    def _worst(answered: list[EndpointView]) -> list[Text]:
        """The endpoint under most pressure (fullest KV, then most waiting), for the compact form."""
        ep = max(answered, key=lambda x: (x.values.get("kv_usage", -1.0), x.values.get("waiting", 0.0)))
        v = ep.values
        line = Text("worst ", style="bold")
        line.append(
            f"{ep.name}: KV {pct(v.get('kv_usage'))} · {whole(v.get('running'))} run "
            f"{whole(v.get('waiting'))} wait · hit {pct(ep.hit_rate_since_start())}"
        )
        return [line]


def spec_line(values: dict[str, float], decode_rate: float | None) -> Text | None:
    """A server that speculates: its draft tokens accepted since it first answered, beside the decode rate."""
    drafted = values.get("spec_drafted")
    if not drafted:
        return None
    accepted = values.get("spec_accepted", 0.0)
    line = Text("spec decode ", style="bold")
    line.append(f"accepted {accepted:,.0f}/{drafted:,.0f} draft tokens ({pct(accepted / drafted)})")
    line.append(f" · decode {rate(decode_rate)} tok/s")
    return line


# The per-endpoint table's columns, most wanted first: (head, width, cell); kept while they fit.
ENDPOINT_COLUMNS: list[tuple[str, int, Callable[[EndpointView | None, ServerView], str]]] = [
    ("KV", 4, lambda ep, srv: pct((ep or srv).values.get("kv_usage"))),
    ("run", 3, lambda ep, srv: whole((ep or srv).values.get("running"))),
    ("wait", 4, lambda ep, srv: whole((ep or srv).values.get("waiting"))),
    ("prefill", 7, lambda ep, srv: rate((ep or srv).prefill_rate)),
    ("decode", 6, lambda ep, srv: rate((ep or srv).decode_rate)),
    ("hit", 4, lambda ep, srv: pct((ep or srv).hit_rate_since_start())),
    # KV a split's decode server received from the prefill server: not in the hit rate (prefix-cache reuse only).
    ("xfer", 5, lambda ep, srv: format_tokens((ep.since_start() if ep else srv.values).get("kv_transferred"))),
    ("role", 7, lambda ep, srv: ep.role if ep else ""),
    ("pre", 3, lambda ep, srv: whole((ep.since_start() if ep else srv.values).get("preemptions"))),
]


def endpoint_table(state: RunState, answered: list[EndpointView], width: int) -> list[Text]:
    """One row per endpoint (tok/s since its window, hit rate since it first
    answered) and a total row, as many columns as fit; a failing endpoint says so."""
    name_w = max(len("endpoint"), min(16, max(len(ep.name) for ep in answered)))  # the head fits its column
    cols, used = [], name_w
    moved = any(ep.since_start().get("kv_transferred") for ep in answered)  # only a split's columns show it
    for col in (c for c in ENDPOINT_COLUMNS if moved or c[0] != "xfer"):
        if used + 1 + col[1] > width:
            break
        cols.append(col)
        used += 1 + col[1]
    head = Text(f"{'endpoint':<{name_w}}", style="bold")
    for title, w, _ in cols:
        head.append(f" {title:>{w}}", style="bold")
    rows = [head]
    for ep in [*answered, None]:
        name = "total" if ep is None else ep.name
        line = Text(f"{name[:name_w]:<{name_w}}", style="bold" if ep is None else "")
        workers = panels.router_workers(state, ep) if ep is not None else None
        if ep is not None and ep.error:
            line.append(f" {ep.error}"[: width - name_w], style="bold red")
        elif workers is not None:  # a router serves no model: its requests per worker instead
            sent = " · ".join(f"{w} {n:,.0f}" for w, n in workers.items()) or "no worker yet"
            line.append(f" requests {sent}"[: width - name_w])
        else:
            for _, w, cell in cols:
                line.append(f" {cell(ep, state.server):>{w}}")
        rows.append(line)
    return rows


def spans_text(state: RunState) -> Text | None:
    """--otlp: the engine's spans matched to turns, those matching none, and exports refused (None: none yet)."""
    led = state.spans
    if not (led.matched or led.unmatched or led.errors):
        return None
    line = Text("spans ", style="bold")
    line.append(f"{led.matched} matched · {led.unmatched} unmatched", style="yellow" if led.unmatched else "")
    if led.errors:
        line.append(f" · {led.errors} refused", style="bold red")
    return line
