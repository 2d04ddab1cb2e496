"""The one home of secret redaction: params by key name (`redact`), command lines (`redact_argv`), and
`scrub`, the filter every text stepscope writes passes through (docs/faults.md#secrets).

A leaf module (standard library and msgspec only): `stepscope.errors` imports it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import msgspec

# Key names that hold secrets. `token` and `auth` must stand as their own word so that
# counts (`max_tokens`, `verify_extra_tokens`) and paths (`--tokenizer`) stay visible.
SECRET_KEY_RE = re.compile(
    r"api[_-]?key|(?:^|[_-])key$|(?:^|[_-])token(?:$|[_-])|(?:^|[_-])auth(?:$|[_-])|authorization"
    r"|secret|password|passwd|credential", re.I)
REDACTED = "***redacted***"

KNOWN_SECRET_MIN_CHARS = 4
"""A value known to be a secret (the API key) is blanked from this length on, as in server.log."""
ENV_SECRET_MIN_CHARS = 8
"""A value of an environment variable whose name only looks secret is blanked from this
length on: `X_AUTH_ENABLED=true` must not blank every "true" of a report."""


def redact(obj: Any, key: str = "") -> Any:
    """Replace secret values anywhere in a nested structure: values under secret-looking
    keys, the value after a secret-looking flag in any list of strings (`extra_args`:
    `--api-key X`, `--api-key=X`), and credentials inside URLs."""
    if isinstance(obj, Mapping):
        return {k: redact(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = redact_argv(list(obj)) if all(isinstance(v, str) for v in obj) else list(obj)
        return [redact(v, key) for v in items]
    # `*_env` keys name the variable that holds a secret, not the secret: keep them.
    if obj is not None and SECRET_KEY_RE.search(key) and not key.endswith("_env"):
        return REDACTED
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


# user:password@ in a URL, and secret-looking query parameters (?token=..., &api_key=...).
# (Anchored on "://" by a look-behind: a scheme pattern tried at every letter made a 13 MB
# artifact take 1.1 s.)
_URL_USERINFO_RE = re.compile(r"(?<=://)[^/@\s:]+(?::[^/@\s]*)?@")
_URL_QUERY_SECRET_RE = re.compile(
    r"(?P<name>[?&](?:[a-z0-9_.-]*(?:api[_-]?key|token|secret|password|passwd|auth|signature|"
    r"credential)[a-z0-9_.-]*))=(?P<value>[^&#\s'\"]+)", re.I)
# `--api-key X` / `--api-key=X` inside free text (a shell line, a raw params file). The
# value may not start with "-", so a flag is never taken for the value of the one before.
_TEXT_FLAG_RE = re.compile(
    r"(?P<flag>--[a-z0-9][a-z0-9_-]*)(?P<sep>=|[\s,'\"\[]+)(?P<value>[^\s,'\"\]-][^\s,'\"\]]*)", re.I)
# An HTTP bearer token (an Authorization header a server or a library echoes).
_BEARER_RE = re.compile(r"(?P<head>\bBearer\s+)(?P<token>[A-Za-z0-9._~+/=-]+)")


def redact_text(text: str) -> str:
    """Redact URL credentials and `--secret-flag value` pairs inside one string."""
    if not text or not any(c in text for c in ":=-"):
        return text
    if "://" in text and "@" in text:
        text = _URL_USERINFO_RE.sub(REDACTED + "@", text)
    if "=" in text:
        text = _URL_QUERY_SECRET_RE.sub(lambda m: m.group("name") + "=" + REDACTED, text)
    if "--" not in text:
        return text
    return _TEXT_FLAG_RE.sub(
        lambda m: m.group("flag") + m.group("sep") + REDACTED
        if SECRET_KEY_RE.search(m.group("flag").lstrip("-")) and m.group("value") != REDACTED
        else m.group(0), text)


def redact_argv(argv: list[str]) -> list[str]:
    """Redact the value after any secret-looking flag (`--api-key X`, `--hf-token=X`)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("--") and SECRET_KEY_RE.search(arg.split("=", 1)[0].lstrip("-")):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


_KEY_VALUE_LINE_RE = re.compile(r"^(?P<head>[ \t]*(?:-[ \t]+)?['\"]?(?P<key>[\w.-]+)['\"]?[ \t]*[:=][ \t]*)(?P<value>\S.*)$",
                                re.M)
_FLOW_PAIR_RE = re.compile(r"(?P<head>[{,][ \t]*['\"]?(?P<key>[\w.-]+)['\"]?[ \t]*:[ \t]*)(?P<value>[^,}\s]+)")


def redact_params_text(text: str) -> str:
    """Redact a params file that could not be parsed: `secret_key: value` lines by key name,
    then URL credentials and `--secret-flag value` pairs anywhere."""
    def line(m: re.Match) -> str:
        key = m.group("key")
        if SECRET_KEY_RE.search(key) and not key.endswith("_env"):
            return m.group("head") + REDACTED
        return m.group(0)

    text = _FLOW_PAIR_RE.sub(line, _KEY_VALUE_LINE_RE.sub(line, text))
    return redact_text(text)


# --------------------------------------------------------------------------- the filter

_SECRET_ENVS: set[str] = set()
"""Variables named as holding a secret (`server.api_key_env`), whatever their name: this
process's params, server.json and the client add theirs through `secret_env`."""


def secret_env(name: str | None) -> str | None:
    """Mark the variable `name` as holding a secret, so `scrub` blanks its value from then on;
    returns its value (None when `name` is None or unset)."""
    if not name:
        return None
    _SECRET_ENVS.add(name)
    return os.environ.get(name)


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """The secret strings `scrub` blanks, longest first: the values of the variables marked
    with `secret_env` and of every secret-looking variable in `env` (os.environ)."""
    env = os.environ if env is None else env
    values = {v for k, v in env.items()
              if len(v) >= (KNOWN_SECRET_MIN_CHARS if k in _SECRET_ENVS else ENV_SECRET_MIN_CHARS)
              and (k in _SECRET_ENVS or SECRET_KEY_RE.search(k)) and v != REDACTED}
    return sorted(values, key=len, reverse=True)


def scrub(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every secret blanked (the module's rules); `secrets` as `secret_values()`."""
    if not text or not isinstance(text, str):
        return text
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    if "Bearer" in text:
        text = _BEARER_RE.sub(_bearer, text)
    return redact_text(text)


def _bearer(m: re.Match) -> str:
    token = m.group("token")
    # a token has a digit or a sign in it, or is long: "Bearer tokens" in prose stays
    looks_secret = len(token) >= 20 or not token.isalpha()
    return m.group("head") + REDACTED if looks_secret and len(token) >= KNOWN_SECRET_MIN_CHARS else m.group(0)


def scrub_plain(obj: Any) -> Any:
    """`obj` (JSON builtins) with every string scrubbed, lists of strings read as command
    lines (`--api-key`, `X`). Checked on its JSON text at once, so an artifact without a
    secret costs one encode and a few searches; `obj` itself is returned then."""
    secrets = secret_values()
    try:
        text = msgspec.json.encode(obj).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        text = None
    if text is not None and scrub(text, secrets) == text:
        return obj
    return _scrub_walk(obj, secrets)


def _scrub_walk(obj: Any, secrets: list[str]) -> Any:
    if isinstance(obj, str):
        return scrub(obj, secrets)
    if isinstance(obj, dict):
        return {scrub(k, secrets) if isinstance(k, str) else k: _scrub_walk(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = redact_argv(list(obj)) if obj and all(isinstance(v, str) for v in obj) else obj
        return [_scrub_walk(v, secrets) for v in items]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """`json.dumps(obj)` with every secret scrubbed (a request log's line)."""
    import json

    return json.dumps(scrub_plain(obj), **kwargs)
