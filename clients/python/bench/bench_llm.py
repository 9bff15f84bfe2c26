"""What timing LLM requests costs, and what the per-gap ``itl_ms`` points cost the store
against the alternative (a per-request histogram of the gaps sent as fields).

1. ``g.token()``: median and p99 per call (batches of 200 calls, minus an empty loop),
   and the calling thread's time to leave the ``with`` block (builds the request's fields
   and queues one item).
2. Per-gap points against a histogram, ``--requests`` requests of ``--tokens`` tokens
   each (default 2,000 x 200) over HTTP into the real agent, each in a fresh data dir:
   the client's CPU per request from the end of the request to the agent's answer (both
   threads: the calling thread queues, the sender builds and sends the lines), the lines
   sent, and the store's growth: the data dir after a graceful stop (as written: WAL and
   SQLite pages included), then what ``edgewatch maintain --recompress`` reports (the raw
   chunks' bytes of the ``llm`` measurement, and the whole file once the 1-minute and
   1-hour tiers are rolled up). The
   token times are synthetic but realistic: 1 request every 1.5 s over the past hour,
   gaps of 20 ms with lognormal jitter, measured in ns like real ones.

Usage (from the repository root): ``python3 clients/python/bench/bench_llm.py --bin
target/debug/edgewatch``. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import edgewatch  # noqa: E402
from edgewatch import _llm  # noqa: E402
from bench_overhead import start_agent  # noqa: E402

perf = time.perf_counter_ns


def token_cost(requests: int, tokens: int) -> Dict[str, float]:
    rec = edgewatch.Recorder("udp://127.0.0.1:9", queue_size=requests + 10)
    per_token: List[float] = []
    exits: List[int] = []
    empty: List[float] = []
    rng = range(tokens)
    for _ in range(requests):
        t0 = perf()
        for _ in rng:
            pass
        empty.append((perf() - t0) / tokens)
        g = rec.generate("bench", prompt_tokens=10, server="bench")
        g.__enter__()
        token = g.token
        t0 = perf()
        for _ in rng:
            token()
        per_token.append((perf() - t0) / tokens)
        t0 = perf()
        g.__exit__(None, None, None)
        exits.append(perf() - t0)
    rec.close(timeout=30)
    base = statistics.median(empty)
    s = sorted(per_token)
    return {
        "token p50 ns": statistics.median(per_token) - base,
        "token p99 ns": s[int(len(s) * 0.99)] - base,
        "exit p50 us": statistics.median(exits) / 1000,
        "exit p99 us": sorted(exits)[int(len(exits) * 0.99)] / 1000,
    }


BUCKETS = [0.5 * 2 ** (k / 2) for k in range(24)]  # 0.5 ms .. ~1.4 s, sqrt(2) apart


def histogram_fields(values: List[float]) -> Dict[str, object]:
    """The alternative: counts per log bucket (only the buckets used), sum and max."""
    counts: Dict[str, object] = {}
    for v in values:
        k = 0
        while k < len(BUCKETS) - 1 and v > BUCKETS[k]:
            k += 1
        key = f"itl_le_{BUCKETS[k]:g}"
        counts[key] = int(counts.get(key, 0)) + 1  # type: ignore[call-overload]
    counts["itl_sum_ms"] = sum(values)
    counts["itl_max_ms"] = max(values)
    return counts


def synthetic(requests: int, tokens: int, seed: int = 1) -> List[Tuple[int, List[int], int]]:
    """(t0, token readings, end) in perf_counter ns, ending before now, 1.5 s apart."""
    rnd = random.Random(seed)
    now = perf()
    out = []
    for i in range(requests):
        end = now - (requests - i) * 1_500_000_000
        gaps = [int(20e6 * rnd.lognormvariate(0, 0.25)) for _ in range(tokens - 1)]
        last = end - 2_000_000
        times = [last]
        for gap in reversed(gaps):
            times.append(times[-1] - gap)
        times.reverse()
        out.append((times[0] - 180_000_000, times, end))
    return out


def fill(gen: edgewatch.Generation, t0: int, times: List[int], end: int) -> None:
    gen._t0 = t0
    gen._times = list(times)
    gen._end = end
    gen._n_at_end = len(times)


def store_run(binary: str, mode: str, requests: int, tokens: int) -> Dict[str, float]:
    data = synthetic(requests, tokens)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, http, _ = start_agent(binary, workdir)
        try:
            rec = edgewatch.Recorder(f"http://127.0.0.1:{http}", app="bench", queue_size=requests * 2)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for t0, times, end in data:
                gen = rec.generate("bench-llm", prompt_tokens=40, server="vllm")
                fill(gen, t0, times, end)
                if mode == "per-gap points":
                    gen.__exit__(None, None, None)
                else:
                    gen._times = times[:1]  # the request point's fields without gaps...
                    gen.__exit__(None, None, None)
                    gen.fields["output_tokens"] = tokens  # ...and the real counts
                    gen.fields["tokens_per_s"] = _llm.decode_rate(tokens, gen.fields["e2e_ms"], gen.fields["ttft_ms"])  # type: ignore[arg-type]
                    gaps = [(b - a) / 1e6 for a, b in zip(times, times[1:])]
                    gen.fields.update(histogram_fields(gaps))
            assert rec.flush(600), rec.stats()
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
            stats = rec.stats()
            rec.close()
        finally:
            proc.terminate()
            proc.wait(60)
        db = workdir / "data"
        written = sum(f.stat().st_size for f in db.iterdir() if f.is_file())
        # Rollup, compaction and the per-measurement byte count (`maintain` prints JSON).
        out = subprocess.run(
            [binary, "maintain", "--data-dir", str(db), "--recompress"], check=True, capture_output=True,
            text=True, env={k: v for k, v in os.environ.items() if not k.startswith("EDGEWATCH_")},
        ).stdout
        report = json.loads(out)
        raw = report["bytes_per_value"]["llm"]
    return {
        "lines": stats["sent"],
        "client CPU per request (us)": cpu / requests * 1e6,
        "client CPU per token (us)": cpu / requests / tokens * 1e6,
        "wall (s)": wall,
        "data dir as written (bytes/request)": written / requests,
        "raw chunks (bytes/request)": raw["bytes"] / requests,
        "raw bytes/value": raw["bytes_per_value"],
        "db after maintain, tiers included (bytes/request)": report["db_bytes"] / requests,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/edgewatch")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()
    cost = token_cost(args.requests, args.tokens)
    print("| g.token() p50 | p99 | leaving the block p50 | p99 |\n|---|---|---|---|")
    print(f"| {cost['token p50 ns']:.0f} ns | {cost['token p99 ns']:.0f} ns | "
          f"{cost['exit p50 us']:.1f} µs | {cost['exit p99 us']:.1f} µs |\n")
    rows = {m: store_run(args.bin, m, args.requests, args.tokens) for m in ("per-gap points", "histogram fields")}
    keys = list(next(iter(rows.values())))
    print(f"{args.requests} requests x {args.tokens} tokens\n")
    print("| | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for m, r in rows.items():
        print(f"| {m} | " + " | ".join(f"{v:,.1f}" if not float(v).is_integer() else f"{int(v):,}" for v in r.values()) + " |")


if __name__ == "__main__":
    main()
