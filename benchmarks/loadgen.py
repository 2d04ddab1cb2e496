"""How many streamed chunks per second can the load client take in? stepscope vs vLLM.

    .venv/bin/python benchmarks/loadgen.py [--concurrency 32] [--requests 128] [--tokens 256] [--rounds 3]

A fake SSE server (stepscope.testing.fake_server; it measures the client, not a model)
runs in its own process and streams fixed completion chunks as fast as it can, batching
events into few socket writes so that the client, not the fake, is the bottleneck. In the
same run, alternating rounds, the same requests at the same concurrency go through
stepscope's client and through vLLM's `async_request_openai_completions`
(vllm.benchmarks.lib.endpoint_request_func), with a session set up like
`vllm bench serve`'s. Reported: token-bearing chunks received per second of wall time,
median over rounds, and the ratio stepscope / vLLM (target >= 1).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time

import aiohttp


def _serve(port_q: "mp.Queue", events_per_write: int) -> None:
    from stepscope.testing.fake_server import FakeBehaviour, FakeServer

    fake = FakeServer(FakeBehaviour(events_per_write=events_per_write, profiler=None)).start()
    port_q.put(fake.port)
    while True:
        time.sleep(3600)


async def _stepscope_round(base_url: str, conc: int, n: int, tokens: int, prompt: list[int]) -> tuple[int, float]:
    from stepscope.sweep import client as cl

    server = cl.ServerInfo(base_url=base_url, served_model="fake")
    payloads = [cl.completion_payload("fake", prompt, tokens) for _ in range(n)]
    async with cl.make_session(server, conc) as session:
        t0 = time.perf_counter()
        recs = await cl.closed_loop(session, server.url("/v1/completions"), payloads,
                                    concurrency=conc, timeout_s=600, input_len=len(prompt))
        wall = time.perf_counter() - t0
    assert all(r.success for r in recs), [r.error for r in recs if not r.success][:3]
    return sum(len(r.chunk_times_s) for r in recs), wall


async def _vllm_round(base_url: str, conc: int, n: int, tokens: int, prompt: list[int]) -> tuple[int, float]:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    connector = aiohttp.TCPConnector(limit=conc, limit_per_host=conc, ttl_dns_cache=300,
                                     keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
    async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                     timeout=aiohttp.ClientTimeout(total=6 * 3600)) as session:
        sem = asyncio.Semaphore(conc)
        inp = RequestFuncInput(prompt=prompt, api_url=base_url + "/v1/completions", prompt_len=len(prompt),
                               output_len=tokens, model="fake", ignore_eos=True)

        async def one():
            async with sem:
                return await async_request_openai_completions(inp, session)

        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
    assert all(o.success for o in outs), [o.error for o in outs if not o.success][:3]
    # vLLM's client records one ITL per chunk after the first
    return sum(len(o.itl) + 1 for o in outs), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256, help="chunks per request (one token each)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events-per-write", type=int, default=16)
    args = ap.parse_args()

    import vllm.benchmarks.lib.endpoint_request_func  # noqa: F401  (import cost outside the timing)

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(q, args.events_per_write), daemon=True)
    proc.start()
    try:
        port = q.get(timeout=60)
        base = f"http://127.0.0.1:{port}"
        prompt = list(range(100, 132))
        rates: dict[str, list[float]] = {"stepscope": [], "vllm": []}
        asyncio.run(_stepscope_round(base, 4, 8, 8, prompt))  # warm the fake and the imports
        asyncio.run(_vllm_round(base, 4, 8, 8, prompt))
        for r in range(args.rounds):
            for name, fn in (("stepscope", _stepscope_round), ("vllm", _vllm_round)):
                chunks, wall = asyncio.run(fn(base, args.concurrency, args.requests, args.tokens, prompt))
                assert chunks == args.requests * args.tokens, (name, chunks)
                rates[name].append(chunks / wall)
                print(f"round {r + 1} {name:9s}: {chunks} chunks in {wall:.3f} s = {chunks / wall:,.0f} chunks/s")
    finally:
        proc.terminate()
        proc.join(10)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\nconcurrency {args.concurrency}, {args.requests} requests x {args.tokens} chunks, "
          f"{args.rounds} rounds, median:")
    print(f"  stepscope client: {med['stepscope']:,.0f} chunks/s")
    print(f"  vLLM client:      {med['vllm']:,.0f} chunks/s")
    print(f"  ratio stepscope / vLLM: {med['stepscope'] / med['vllm']:.2f}  (target >= 1.00)")


if __name__ == "__main__":
    main()
