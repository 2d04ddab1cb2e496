"""The streaming load client: one aiohttp session, raw per-request records.

Requests are OpenAI `/v1/completions` streams with exact-length prompts and `ignore_eos`; `perf_counter` is
stamped once per network read, before parsing, so parsing never shifts a timestamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import aiohttp
import msgspec
import numpy as np

from stepscope import schema
from stepscope.errors import ServerError, StageInputMissing
from stepscope.redaction import scrub, secret_env
from stepscope.sweep.arrivals import arrival_offsets_s
from stepscope.sweep.metrics import RequestRecord

READ_BUFSIZE = 1 << 20
"""aiohttp's default 64 KiB read buffer makes many small reads under load."""

_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class ServerInfo:
    """What stages 01 and 04 need to know about the server (from 00_deploy/server.json)."""

    base_url: str
    served_model: str
    engine: str = "vllm"
    engine_version: str | None = None
    profiler_dir: str | None = None
    tp: int = 1
    api_key_env: str | None = None
    model_path: str | None = None
    """The model folder the server loaded (its /v1/models `root`), for a local tokenizer."""
    launch: dict[str, Any] = field(default_factory=dict)
    """What makes this server measure what it does (mode, engine, version, argv, env, redacted): part of a
    level's identity."""

    @property
    def headers(self) -> dict[str, str]:
        key = secret_env(self.api_key_env)  # from here on, scrub blanks it wherever it shows
        return {"Authorization": f"Bearer {key}"} if key else {}

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path


def load_server(run_dir: str | Path) -> ServerInfo:
    """The server stage 00 started or attached to, from `run_dir/00_deploy/server.json`."""
    path = Path(run_dir) / "00_deploy" / "server.json"
    if not path.is_file():
        raise StageInputMissing(
            "needs 00_deploy/server.json, which is not there", where=str(path),
            hint=f"run the deploy stage first: stepscope run <params> --run-id {Path(run_dir).name} --stages 00")
    d = schema.read(path, schema.ServerRecord)
    secret_env(d.api_key_env)  # the key is blanked from everything this stage writes
    missing = [k for k in ("base_url", "served_model") if not getattr(d, k)]
    if missing:
        raise StageInputMissing(f"server.json lacks {', '.join(missing)}", where=str(path),
                                hint="re-run the deploy stage (00) to rewrite it")
    return ServerInfo(
        base_url=d.base_url, served_model=d.served_model, engine=d.engine or "vllm",
        engine_version=d.engine_version, profiler_dir=d.profiler_dir, tp=d.tp or 1, api_key_env=d.api_key_env,
        model_path=d.models_response.root() if d.models_response is not None else None,
        launch={k: schema.to_builtins(getattr(d, k)) for k in SERVER_IDENTITY_KEYS})


SERVER_IDENTITY_KEYS = ("mode", "engine", "engine_version", "base_url", "served_model", "tp", "argv", "env")
"""The server.json fields that change what a load level measures (not pid, pgid, times)."""


def make_session(server: ServerInfo, limit: int) -> aiohttp.ClientSession:
    """One session per load level: the connection limit is the level's concurrency."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max(1, limit), force_close=False),
        headers=server.headers, read_bufsize=READ_BUFSIZE,
        timeout=aiohttp.ClientTimeout(total=None))


def run_sync(coro):
    """Run a coroutine to completion from synchronous code, also inside Jupyter, whose kernel
    already runs an event loop in the main thread (there it runs in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stepscope-client") as ex:
        return ex.submit(asyncio.run, coro).result()


# --------------------------------------------------------------------------- prompts

_PROMPT_TEXT = (
    "The engineer opened the trace and counted every kernel of the decode step: the "
    "matrix multiplications, the attention over the cache, the all-reduce after each "
    "projection, and the small norms and activations between them. Numbers without "
    "units mean nothing, so each one carried its unit and its count. "
)


async def post_text(session: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None,
                    *, timeout_s: float | None = None) -> tuple[int, str]:
    """POST (with a JSON body when given) and return (status, text). A server that cannot
    be reached is a ServerError naming the URL; any HTTP status is the caller's to judge."""
    kwargs: dict[str, Any] = {} if body is None else {"json": body}
    if timeout_s is not None:
        kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.post(url, **kwargs) as resp:
            return resp.status, await resp.text()
    except aiohttp.ClientError as exc:
        raise ServerError(f"cannot reach the server: {exc}", where=url,
                          hint="is the server from 00_deploy still running?") from None


async def post_briefly(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, str]:
    """POST with no body, waiting `timeout_s` at most: (status, text), or (0, why) when no answer
    came (a call made to a server already found silent, which must not hang as well)."""
    try:
        return await post_text(session, url, None, timeout_s=timeout_s)
    except (ServerError, asyncio.TimeoutError, TimeoutError) as exc:
        return 0, f"no answer within {timeout_s:g} s ({type(exc).__name__})"


async def token_pool(session: aiohttp.ClientSession, server: ServerInfo) -> list[int]:
    """Distinct token IDs of ordinary text: from the server's own `/tokenize`, or, where the
    server has none, from the model's tokenizer when its folder is readable here."""
    url = server.url("/tokenize")
    body = {"model": server.served_model, "prompt": _PROMPT_TEXT * 4, "add_special_tokens": False}
    status, text = await post_text(session, url, body, timeout_s=60)
    if status == 200:
        tokens = json.loads(text).get("tokens") or []
    elif server.model_path and Path(server.model_path, "tokenizer_config.json").is_file():
        tokens = _local_tokens(server.model_path)
    else:
        raise ServerError(f"/tokenize answered HTTP {status}: {text[:200]}", where=url,
                          hint="stepscope builds exact-length prompts from the server's tokenizer: use a "
                               "server that exposes /tokenize, or make the model folder readable here "
                               "(server.json models_response root)")
    pool = sorted(set(int(t) for t in tokens))
    if len(pool) < 8:
        raise ServerError(f"the tokenizer returned only {len(pool)} distinct tokens", where=url)
    return pool


def _local_tokens(model_path: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return list(tok.encode(_PROMPT_TEXT * 4, add_special_tokens=False))


class PromptSource:
    """Prompts of exactly `input_len` tokens, made on demand (a level with a minimum duration does not know
    its request count). `random_text` builds text like vLLM's random dataset, re-encoded until its length
    (special tokens included) is exact."""

    def __init__(self, mode: str, pool: Sequence[int], input_len: int, seed: int = 0, tokenizer=None):
        self.mode, self.input_len = mode, input_len
        self.rng = np.random.default_rng(seed)
        self.pool = np.asarray(pool)
        self.tokenizer = tokenizer
        self.length_mismatches = 0
        if mode == "random_text":
            if tokenizer is None:
                raise ServerError("prompt_mode random_text needs the model's tokenizer", where="params: sweep.prompt_mode",
                                  hint="make the model folder readable here, or use prompt_mode: token_ids")
            special = set(tokenizer.all_special_ids)
            self.allowed = np.array([t for t in range(tokenizer.vocab_size) if t not in special])
            self.target = max(1, input_len - int(tokenizer.num_special_tokens_to_add()))
            self.index = 0

    def take(self, n: int) -> list:
        return [self.next() for _ in range(n)]

    def next(self) -> list[int] | str:
        if self.mode == "token_ids":
            return self.rng.choice(self.pool, size=self.input_len).tolist()
        self.index += 1
        text = None
        # A run of byte-level pieces can decode to text that never re-encodes to the same
        # length (split UTF-8 sequences): start again from another offset.
        for _ in range(8):
            offset = int(self.rng.integers(0, len(self.allowed)))
            ids = self.allowed[(offset + self.index + np.arange(self.target)) % len(self.allowed)].tolist()
            text, exact = self._exact_text(ids)
            if exact:
                return text
        self.length_mismatches += 1  # kept, and counted, like vLLM's own generator does
        return text

    def _exact_text(self, ids: list[int]) -> tuple[str, bool]:
        tok = self.tokenizer
        for _ in range(10):
            text = tok.decode(ids)
            again = tok.encode(text, add_special_tokens=False)
            if len(again) == self.target:
                return text, True
            if len(again) > self.target:
                ids = again[: self.target]
            else:
                ids = again + self.rng.choice(self.allowed, size=self.target - len(again)).tolist()
        return tok.decode(ids), False


def local_tokenizer(server: ServerInfo):
    """The served model's tokenizer, read from its folder (None when it is not readable here)."""
    if not server.model_path or not Path(server.model_path, "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model_path)


def make_prompts(pool: Sequence[int], input_len: int, n: int, seed: int = 0) -> list[list[int]]:
    """n token-ID prompts of exactly input_len tokens, each different from the first token
    on, so prefix caching cannot shorten a later request's prefill."""
    rng = np.random.default_rng(seed)
    return [rng.choice(np.asarray(pool), size=input_len).tolist() for _ in range(n)]


# --------------------------------------------------------------------------- liveness

SILENCE_ERROR = "silence timeout"
"""The start of the error of a request the liveness watchdog ended (`Silence`)."""
HEALTH_PROBE_S = 5.0
"""How long the watchdog's /health probe waits for an answer, s."""
SHOW_SILENCE_S = 5.0
"""A silence this long shows on the progress bar (seconds silent), s."""
WARMUP_SILENCE_MIN_S = 60.0
"""The least silence the watchdog allows a warm-up request, s: a cold server's first tokens pay one-off costs
(over 5 s on the 2-core demo)."""
SILENCE_HINT = ("a stopped or deadlocked server may log nothing: look at its processes' state "
                "(`ps -o stat,pid,cmd -g <pgid from 00_deploy/server.json>`; T is stopped, `kill -CONT` "
                "resumes it), their CPU use and `py-spy dump --pid <pid>`; raise silence_timeout_s "
                "(sweep, capture) if the server is only slow")


class Silence:
    """A liveness watchdog over every stream of a level: no token on any stream for `timeout_s` probes
    /health, says which failure it is, and ends the level, its open requests recorded as timeouts
    (`SILENCE_ERROR`). `show(text)` feeds a progress bar."""

    def __init__(self, timeout_s: float, show=None):
        self.timeout_s, self.show = timeout_s, show
        self.open: set[asyncio.Task] = set()
        self.last_heard = time.perf_counter()
        self.verdict: dict[str, Any] | None = None
        self._shown = False

    @contextlib.contextmanager
    def warming_up(self):
        """The block's requests are warm-ups: the limit is at least WARMUP_SILENCE_MIN_S."""
        measured_s = self.timeout_s
        self.timeout_s = max(measured_s, WARMUP_SILENCE_MIN_S)
        try:
            yield self
        finally:
            self.timeout_s = measured_s

    def opened(self) -> None:
        if not self.open:
            self.last_heard = time.perf_counter()  # the silence counts from the first open stream
        self.open.add(asyncio.current_task())

    def heard(self, now: float) -> None:
        self.last_heard = now

    def check_events(self, eventless_s: float, pending_bytes: int) -> None:
        """A stream whose bytes keep coming (so the level never falls silent) but make no
        complete SSE event for the timeout fails its request (BadReply) with the reason."""
        if eventless_s >= self.timeout_s:
            raise BadReply(f"no complete SSE event for {eventless_s:.1f} s while bytes kept arriving "
                           f"({pending_bytes} bytes without an event end; silence timeout {self.timeout_s:g} s)")

    def closed(self) -> None:
        self.open.discard(asyncio.current_task())

    @property
    def tripped(self) -> bool:
        return self.verdict is not None

    def error(self) -> str:
        return f"{SILENCE_ERROR}: {self.verdict['message']}" if self.verdict else SILENCE_ERROR

    def raise_if_tripped(self, where: str) -> None:
        if self.verdict is not None:
            raise ServerError(self.verdict["message"], where=where, hint=SILENCE_HINT)

    def timed_out(self, records) -> int:
        """How many of `records` the watchdog ended."""
        return sum(1 for r in records if (r.error or "").startswith(SILENCE_ERROR))

    async def watch(self, session: aiohttp.ClientSession, server: "ServerInfo", what: str) -> None:
        """Run beside the requests (as a task; cancel it when they are done)."""
        while not self.tripped:
            await asyncio.sleep(min(1.0, self.timeout_s / 4))
            silent = time.perf_counter() - self.last_heard if self.open else 0.0
            self._show(silent)
            if silent < self.timeout_s:
                continue
            self.verdict = await self._judge(session, server, what, silent, len(self.open))
            for task in list(self.open):
                task.cancel()

    @contextlib.asynccontextmanager
    async def watching(self, server: "ServerInfo", what: str):
        """The watchdog running (on a session of its own, so that its probe never waits for a
        load slot) for the duration of the block."""
        async with make_session(server, 1) as side:
            task = asyncio.create_task(self.watch(side, server, what))
            try:
                yield self
            finally:
                task.cancel()

    def _show(self, silent_s: float) -> None:
        if self.show is None:
            return
        if silent_s >= SHOW_SILENCE_S:
            self.show(f"no token for {silent_s:.0f} s (timeout at {self.timeout_s:g} s)")
            self._shown = True
        elif self._shown:
            self.show("")
            self._shown = False

    async def _judge(self, session, server: "ServerInfo", what: str, silent_s: float, n_open: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            async with session.get(server.url("/health"), timeout=aiohttp.ClientTimeout(total=HEALTH_PROBE_S)) as r:
                health = f"HTTP {r.status}"
        except (asyncio.TimeoutError, TimeoutError):
            health = f"no answer within {HEALTH_PROBE_S:g} s"
        except (aiohttp.ClientError, ConnectionError) as exc:
            health = f"unreachable ({type(exc).__name__})"
        alive = health == "HTTP 200"
        state = "server alive but not answering" if alive else "server not answering /health either"
        message = (f"{state}: no token on any of the {n_open} open stream(s) for {silent_s:.0f} s during {what} "
                   f"(timeout {self.timeout_s:g} s); /health: {health} after {time.perf_counter() - t0:.1f} s; "
                   f"the {n_open} open request(s) were ended as timeouts")
        return {"state": "alive_not_answering" if alive else "not_answering", "silent_s": round(silent_s, 1),
                "timeout_s": self.timeout_s, "health": health, "n_open": n_open, "message": message}


# --------------------------------------------------------------------------- one request


def completion_payload(model: str, prompt: list[int] | str, output_len: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_request(session: aiohttp.ClientSession, url: str, payload: dict[str, Any], *,
                         timeout_s: float, request_id: int = 0, warmup: bool = False,
                         input_len: int = 0, on_first_chunk=None, silence: Silence | None = None) -> RequestRecord:
    """Send one streaming completion and keep its raw timing; never raises for a failed request.
    `on_first_chunk(request_id)` fires at its first token (a load capture waits for every prefill)."""
    rec = RequestRecord(start_s=0.0, request_id=request_id, warmup=warmup, input_tokens=input_len)
    rec.start_s = time.perf_counter()
    if silence is None:
        return await _stream(session, url, payload, rec, timeout_s, on_first_chunk, None)
    if silence.tripped:  # the watchdog already ended the level: nothing more is sent
        rec.error, rec.end_s = silence.error(), rec.start_s
        return rec
    silence.opened()
    try:
        return await _stream(session, url, payload, rec, timeout_s, on_first_chunk, silence)
    except asyncio.CancelledError:
        if not silence.tripped:
            raise  # an interrupt, not the watchdog
        asyncio.current_task().uncancel()  # handled: later awaits of this task are not cancelled
        rec.error, rec.success, rec.end_s = silence.error(), False, time.perf_counter()
        return rec
    finally:
        silence.closed()


MAX_SSE_EVENT_BYTES = 1 << 20
"""The most bytes one SSE event may hold before its end (a blank line): a completion chunk is
a few hundred bytes, and a stream that never sends the blank line must not grow a buffer."""
MAX_STREAM_BYTES_PER_TOKEN = 16 << 10
"""A stream may send MAX_SSE_EVENT_BYTES plus this much per requested token in all (about 50x
what vLLM sends): past that the request fails, so a server that never stops cannot hold a level."""
ERROR_BODY_CHARS = 500
"""How much of a non-200 reply's body its request's error keeps (read no further)."""
USAGE_SLACK_TOKENS = 16
"""A usage count may pass what the request allows by this much (special tokens a server adds
to the prompt, e.g. BOS); beyond it the count is impossible and the request fails."""


class BadReply(Exception):
    """A reply no OpenAI-compatible server sends: its request fails with this reason, as in vLLM's benchmark.
    """


@dataclass(frozen=True)
class ReplyLimits:
    """What one request's reply may hold."""

    max_completion_tokens: int
    max_prompt_tokens: int
    max_stream_bytes: int

    @classmethod
    def of(cls, payload: dict[str, Any]) -> "ReplyLimits":
        max_tokens = int(payload.get("max_tokens") or 0)
        prompt = payload.get("prompt")
        # every token covers a byte or more of text (byte-level and byte-fallback tokenizers)
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt or "").encode())
        return cls(max_tokens + USAGE_SLACK_TOKENS, n_prompt + USAGE_SLACK_TOKENS,
                   MAX_SSE_EVENT_BYTES + max_tokens * MAX_STREAM_BYTES_PER_TOKEN)


async def _stream(session: aiohttp.ClientSession, url: str, payload: dict[str, Any], rec: RequestRecord,
                  timeout_s: float, on_first_chunk, silence: Silence | None) -> RequestRecord:
    try:
        async with session.post(url, json=payload,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                body = (await resp.content.read(4 * ERROR_BODY_CHARS)).decode("utf-8", "replace")
                rec.error = scrub(f"HTTP {resp.status} {resp.reason}: {body[:ERROR_BODY_CHARS]}")
                rec.end_s = time.perf_counter()
                return rec
            done = await _read_events(resp, rec, ReplyLimits.of(payload), on_first_chunk, silence)
            rec.end_s = time.perf_counter()
            if rec.error is None and not done:
                rec.error = "stream closed before [DONE]"
            rec.success = rec.error is None and bool(rec.chunk_times_s)
            if rec.error is None and not rec.chunk_times_s:
                rec.error = "stream ended without a token-bearing chunk"
    except asyncio.TimeoutError:
        rec.error = f"timeout after {timeout_s:g} s"
    except BadReply as exc:
        rec.error, rec.success = scrub(f"bad reply: {exc}"), False
    except (aiohttp.ClientError, ConnectionError) as exc:
        rec.error = scrub(f"{type(exc).__name__}: {exc}")
    if rec.end_s is None:
        rec.end_s = time.perf_counter()
    return rec


async def _read_events(resp: aiohttp.ClientResponse, rec: RequestRecord, limits: ReplyLimits,
                       on_first_chunk, silence: Silence | None) -> bool:
    """Read the SSE stream into `rec`; True when it ended with [DONE]. A reply that breaks a
    limit, or bytes that make no event for the silence timeout, raise BadReply."""
    buf, done, n_bytes = b"", False, 0
    last_event_s = time.perf_counter()
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        if silence is not None:
            silence.heard(now)
        buf += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        events = buf.split(b"\n\n")
        buf = events.pop()  # what follows the last blank line: an event not yet complete
        if len(buf) > MAX_SSE_EVENT_BYTES:
            raise BadReply(f"{len(buf)} bytes arrived with no SSE event end (a blank line): over the "
                           f"{MAX_SSE_EVENT_BYTES} bytes one event may hold")
        n_bytes += len(data)
        if n_bytes > limits.max_stream_bytes:
            raise BadReply(f"the stream passed {limits.max_stream_bytes} bytes, more than its "
                           f"{limits.max_completion_tokens - USAGE_SLACK_TOKENS} tokens can need")
        if events:
            last_event_s = now
        elif silence is not None:
            silence.check_events(now - last_event_s, len(buf))
        for event in events:
            done |= _read_event(event, rec, now, limits, on_first_chunk)
    return done


def _read_event(event: bytes, rec: RequestRecord, now: float, limits: ReplyLimits, on_first_chunk) -> bool:
    """One SSE event into `rec` (its token chunk, error, usage); True for `data: [DONE]`."""
    done = False
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue  # comments (":ping"), event names, ids
        body = line[5:].strip()
        if body == b"[DONE]":
            done = True
            continue
        try:
            msg = _decode(body)
        except msgspec.DecodeError as exc:
            raise BadReply(f"an SSE event is not JSON ({exc}): {_clip(body)}") from None
        if not isinstance(msg, dict):
            raise BadReply(f"an SSE event is JSON but not an object: {_clip(body)}")
        choices = msg.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise BadReply(f"`choices` is not a list: {_clip(body)}")
        if choices:
            rec.chunk_times_s.append(now)
            if on_first_chunk is not None and len(rec.chunk_times_s) == 1:
                on_first_chunk(rec.request_id)
        elif "error" in msg or msg.get("object") == "error":
            err = msg.get("error", msg)
            rec.error = scrub("SSE error: " + str(err.get("message", err) if isinstance(err, dict) else err))
        usage = msg.get("usage")
        if usage is not None:
            _read_usage(usage, rec, limits, body)
    return done


def _read_usage(usage: Any, rec: RequestRecord, limits: ReplyLimits, body: bytes) -> None:
    if not isinstance(usage, dict):
        raise BadReply(f"`usage` is not an object: {_clip(body)}")
    if usage.get("completion_tokens") is not None:
        rec.output_tokens = _count(usage["completion_tokens"], "completion_tokens", limits.max_completion_tokens,
                                   "max_tokens")
    if usage.get("prompt_tokens") is not None:
        rec.input_tokens = _count(usage["prompt_tokens"], "prompt_tokens", limits.max_prompt_tokens,
                                  "the prompt's length")


def _count(value: Any, name: str, most: int, basis: str) -> int:
    """A usage count that can be: a whole number from 0 to `most`."""
    if type(value) is not int:
        raise BadReply(f"usage.{name} is {_clip(repr(value).encode())}, not a whole number")
    if not 0 <= value <= most:
        raise BadReply(f"usage.{name} is {value}, outside the 0 to {most} this request allows "
                       f"({basis} {most - USAGE_SLACK_TOKENS} + {USAGE_SLACK_TOKENS})")
    return value


def _clip(raw: bytes, n: int = 120) -> str:
    text = raw[:n].decode("utf-8", "replace")
    return text + ("..." if len(raw) > n else "")


# --------------------------------------------------------------------------- load shapes


async def closed_loop(session: aiohttp.ClientSession, url: str, payloads: list[dict[str, Any]], *,
                      concurrency: int, timeout_s: float, input_len: int, warmup: bool = False,
                      on_done=None, more=None, min_duration_s: float = 0.0,
                      silence: Silence | None = None) -> list[RequestRecord]:
    """Keep exactly `concurrency` requests in flight until every payload is sent and, when
    `more` (a function making the next payload) is given, until `min_duration_s` has passed."""
    queue = list(enumerate(payloads))
    queue.reverse()
    out: list[RequestRecord] = []
    until = time.perf_counter() + min_duration_s
    next_id = [len(payloads)]

    def take() -> tuple[int, dict[str, Any]] | None:
        if silence is not None and silence.tripped:
            return None  # the level ended at a silence timeout: send no more
        if queue:
            return queue.pop()
        if more is not None and time.perf_counter() < until:
            next_id[0] += 1
            return next_id[0] - 1, more()
        return None

    async def worker() -> None:
        while (item := take()) is not None:
            i, p = item
            rec = await stream_request(session, url, p, timeout_s=timeout_s, request_id=i,
                                       warmup=warmup, input_len=input_len, silence=silence)
            out.append(rec)
            if on_done is not None:
                on_done(rec)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(payloads)))))
    return sorted(out, key=lambda r: r.request_id)


async def open_loop(session: aiohttp.ClientSession, url: str, payloads: list[dict[str, Any]], *,
                    rate_rps: float, timeout_s: float, input_len: int, seed: int = 0,
                    on_done=None, burstiness: float = 1.0,
                    offsets_s: Sequence[float] | None = None,
                    silence: Silence | None = None) -> list[RequestRecord]:
    """Arrivals at `rate_rps` with gamma gaps of shape `burstiness`, or at `offsets_s` (a ramp, a replayed
    trace); no cap on requests in flight."""
    if offsets_s is None:
        offsets_s = arrival_offsets_s(len(payloads), rate_rps, burstiness=burstiness, seed=seed)
    t0 = time.perf_counter()
    arrivals = t0 + np.asarray(offsets_s, dtype=float)

    async def one(i: int, p: dict[str, Any]) -> RequestRecord | None:
        delay = arrivals[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if silence is not None and silence.tripped:
            return None  # the level ended at a silence timeout: not sent
        rec = await stream_request(session, url, p, timeout_s=timeout_s, request_id=i, input_len=input_len,
                                   silence=silence)
        if on_done is not None:
            on_done(rec)
        return rec

    recs = await asyncio.gather(*(one(i, p) for i, p in enumerate(payloads)))
    return [r for r in recs if r is not None]


# --------------------------------------------------------------------------- server state


async def is_alive(session: aiohttp.ClientSession, server: ServerInfo, timeout_s: float = 5.0) -> bool:
    try:
        async with session.get(server.url("/health"), timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, ConnectionError):
        return False


SERVER_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    # SGLang's names for the same gauges
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_cache_usage",
}


def parse_prometheus_gauges(text: str) -> dict[str, float]:
    """running / waiting / kv_cache_usage (0-1) summed over label sets, from /metrics text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        key = SERVER_GAUGES.get(name)
        if key is None:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out


async def metrics_text(session: aiohttp.ClientSession, server: ServerInfo) -> str | None:
    """The server's /metrics text, or None when it cannot be read: what asks for it goes on
    without it (a missing reading is reported missing, never guessed)."""
    try:
        async with session.get(server.url("/metrics"), timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.text() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ConnectionError):
        return None
