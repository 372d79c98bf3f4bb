"""The one rule for keeping credentials off the screen and out of recordings: a command line as
recorded, and an error line that quotes what the user typed, both pass through scrub_argv."""

from __future__ import annotations

import json
import re
from typing import Any

from rampwatch.drivers.client.request_options import HeaderTemplate, is_secret_header
from rampwatch.drivers.telemetry.metrics import redact_url

HIDDEN = "***"
# Vendors' key prefixes (OpenAI sk-, Hugging Face hf_, GitHub, GitLab, Slack, AWS), then anything long that
# looks random: 32 or more letters and digits together, nothing else (a model name has hyphens or dots).
_KEY_LIKE = re.compile(r"(?:sk|pk|rk|hf|ghp|gho|ghs|glpat|xox[abpr])[-_][A-Za-z0-9_\-]{6,}|AKIA[A-Z0-9]{12,}")
_RANDOM_LIKE = re.compile(r"(?=[A-Za-z0-9]*[A-Za-z])(?=[A-Za-z0-9]*[0-9])[A-Za-z0-9]{32,}")
# A flag whose name says its value is a secret (--api-key, --token, --password, ...), mistyped or not;
# the two that only name where the key is (an environment variable, a file) are not secrets.
_SECRET_FLAG = re.compile(r"--?(?:[\w-]*[-_])?(?:key|secret|passw\w*|token|auth\w*|bearer)(?:[-_][\w-]*)?", re.I)
_NAMES_WHERE_THE_KEY_IS = ("--api-key-env", "--api-key-file", "--metrics-auth-env")


def looks_secret(value: str) -> bool:
    """A value that looks like an API key or token wherever it stands."""
    return bool(_KEY_LIKE.fullmatch(value) or _RANDOM_LIKE.fullmatch(value))


def _secret_flag(arg: str) -> bool:
    return bool(_SECRET_FLAG.fullmatch(arg)) and arg not in _NAMES_WHERE_THE_KEY_IS


def scrub_arg(arg: str, after_secret_flag: bool = False) -> str:
    """One argument without credentials: URL user:password@ removed, a key-like value (or any value
    right after a secret-named flag) hidden, --flag=value split and judged as the two would be."""
    if after_secret_flag and not arg.startswith("-"):
        return HIDDEN
    flag, eq, value = arg.partition("=")
    if eq and flag.startswith("-"):
        return f"{flag}={scrub_arg(value, _secret_flag(flag))}"
    if _HEADER_LIKE.match(arg):  # 'Authorization: Bearer …' wherever it stands (a mistyped --header, say)
        return scrub_header_arg(arg)
    return scrub_words(redact_url(arg) if "://" in arg else arg)


_HEADER_LIKE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:\s")
_NAME_THEN_VALUE = re.compile(r"\s*([!#$%&'*+\-.^_`|~0-9A-Za-z]+)[\s=]+\S")


_WORD = re.compile(r"[^\s'\",:=]+")


def scrub_words(text: str) -> str:
    """`text` with every word that looks like a key hidden (a key inside a prompt, a JSON body, a quote)."""
    return _WORD.sub(lambda m: HIDDEN if looks_secret(m.group()) else m.group(), text)


def scrub_header_value(name: str, value: str) -> str:
    """A request header's value as shown: hidden when its name says credential, else its key-like words."""
    return HIDDEN if is_secret_header(name) else scrub_words(value)


def scrub_header_arg(spec: str) -> str:
    """A --header 'NAME: VALUE' argument with a credential's value hidden."""
    name, colon, value = spec.partition(":")
    if not colon:
        # The colon forgotten ('Authorization Bearer …', 'X-Api-Key=…'): a name that says credential still hides
        # what follows it.
        named = _NAME_THEN_VALUE.match(spec)
        return f"{named.group(1)} {HIDDEN}" if named and is_secret_header(named.group(1)) else scrub_arg(spec)
    shown = scrub_header_value(name, value.strip())
    return spec if shown == value.strip() else f"{name.strip()}: {shown}"


def shown_headers(templates: list[HeaderTemplate]) -> dict[str, str]:
    """--header as the recording keeps it and the report prints it."""
    return {h.name: scrub_header_value(h.name, h.value) for h in templates}


def scrub_json(value: Any) -> Any:
    """--extra-body as recorded: the value of a key whose name says credential hidden, and any key-like word."""
    if isinstance(value, dict):
        return {k: HIDDEN if is_secret_header(k) else scrub_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_json(v) for v in value]
    return scrub_words(value) if isinstance(value, str) else value


def scrub_extra_body_arg(text: str) -> str:
    """An --extra-body argument as recorded: its JSON through scrub_json (a file's name, or text that is not
    JSON, through scrub_arg)."""
    try:
        body = json.loads(text)
    except ValueError:
        return scrub_arg(text)
    return json.dumps(scrub_json(body), separators=(",", ":"))


def scrub_argv(argv: list[str]) -> list[str]:
    """The command line as recorded and as quoted back: every argument through scrub_arg, and a
    --header's value through scrub_header_arg."""
    out = []
    for k, arg in enumerate(argv):
        before = argv[k - 1] if k else ""
        flag, eq, value = arg.partition("=")
        if before in _BY_FLAG:
            out.append(_BY_FLAG[before](arg))
        elif eq and flag in _BY_FLAG:
            out.append(f"{flag}={_BY_FLAG[flag](value)}")
        else:
            out.append(scrub_arg(arg, bool(before) and _secret_flag(before)))
    return out


_BY_FLAG = {"--header": scrub_header_arg, "--extra-body": scrub_extra_body_arg}


def scrub_message(message: str, argv: list[str]) -> str:
    """An error line (argparse quotes what it did not take) with every argument scrub_argv changes
    replaced by its scrubbed form, longest first so a value inside another is not left half-shown."""
    pairs = sorted(((a, s) for a, s in zip(argv, scrub_argv(argv)) if a != s), key=lambda p: -len(p[0]))
    for arg, scrubbed in pairs:
        message = message.replace(arg, scrubbed)
        _, eq, value = arg.partition("=")
        if eq and value and looks_secret(value):
            message = message.replace(value, HIDDEN)
    message = scrub_words(message)  # a key argparse quotes differently from argv
    return message
