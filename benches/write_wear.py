#!/usr/bin/env python3
"""Bytes the agent writes to disk per hour with many series on a store that is already old.

The device-budget script (scripts/device_budget.py) measures the reference Jetson workload
on a fresh store, where every table is small. A device that has run for a day is different:
its rollup rows and chunk index are keyed by series, so whatever touches every active series
(a rollup fold, indexing the chunk tail) writes about one page per series. This bench makes
that store and measures it:

1. a release agent on a fresh data dir (collectors off, default retention and sync, tiers
   folded every run);
2. `--hours` of history for `--series` series (one point a minute each, past timestamps,
   posted to /write), folded by `edgewatch maintain`; the agent is restarted with the
   `fold_every` under test and left `--settle` seconds (its first rollup run);
3. a live phase: one point per series every second (one POST a second), `--seconds` long;
   written bytes from /proc/PID/io `write_bytes`;
4. the WAL's frames at the end, by table and index (SQLite's `dbstat`), per commit.

    python3 benches/write_wear.py                      # 600 series, 24 h, 150 s
    python3 benches/write_wear.py --series 200 --hours 2 --seconds 60
    python3 benches/write_wear.py --fold-every 1m --seconds 600   # tiers folded every minute

`--fold-every` sets `[rollup] fold_every` (default: the agent's, 1 min). A live phase
shorter than it sees no fold of the 1m and 1h tiers: to count the folds' writes, run the
live phase for at least `--fold-every`.

Standard library only; the agent listens on a free port of 127.0.0.1 and is stopped by PID.
"""

import argparse
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import fleet  # noqa: E402  (free_port, wait_until, http_get, post_all)
from device_budget import wal_frames, write_bytes  # noqa: E402


def post(port, lines):
    fleet.post_all(port, "/write", ["\n".join(lines).encode()])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "edgewatch"))
    ap.add_argument("--series", type=int, default=600)
    ap.add_argument("--hours", type=float, default=24.0, help="history before the live phase")
    ap.add_argument("--seconds", type=int, default=150, help="live phase")
    ap.add_argument("--settle", type=int, default=40, help="seconds after the live agent starts (its first run)")
    ap.add_argument("--fold-every", help="[rollup] fold_every (default: the agent's)")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"no agent binary at {a.bin}: run `cargo build --release` first")
    work = tempfile.mkdtemp(prefix="edgewatch-wear-")
    port = fleet.free_port()
    cfg = os.path.join(work, "edgewatch.toml")
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(work, "agent.log"), "w")

    def start(fold_every):
        with open(cfg, "w") as f:
            f.write(f'[storage]\ndata_dir = "{work}/data"\n[http]\nlisten = "127.0.0.1:{port}"\n'
                    "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n"
                    "[kmsg]\nenabled = false\n")
            if fold_every:
                f.write(f'[rollup]\nfold_every = "{fold_every}"\n')
        proc = subprocess.Popen([a.bin, "run", "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
        if not fleet.wait_until(30, lambda: fleet.http_get(base + "/health")[0] == 200):
            proc.kill()
            sys.exit("the agent did not start: see " + log.name)
        return proc

    def stop(proc):
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()

    # The history is folded by `edgewatch maintain` (the day-old store's tiers are complete),
    # then the live agent starts on it with the `fold_every` under test.
    agent = start(None)
    try:
        rnd = random.Random(7)
        now = time.time_ns()
        minutes = int(a.hours * 60)
        lines = []
        for m in range(minutes):
            ts = now - (minutes - m) * 60 * 10**9
            for s in range(a.series):
                lines.append(f"inference,model=m{s:04d} wall_ms={rnd.uniform(5, 25):.3f} {ts}")
            if len(lines) >= 5000:
                post(port, lines)
                lines = []
        if lines:
            post(port, lines)
        print(f"history: {a.series} series x {minutes} minutes posted; folding it", flush=True)
        stop(agent)
        subprocess.run([a.bin, "maintain", "--config", cfg], check=True, stdout=log, stderr=subprocess.STDOUT)
        agent = start(a.fold_every)
        time.sleep(a.settle)
        w0, t0 = write_bytes(agent.pid), time.monotonic()
        k = 0
        while time.monotonic() - t0 < a.seconds:
            ts = time.time_ns()
            post(port, [f"inference,model=m{s:04d} wall_ms={rnd.uniform(5, 25):.3f} {ts}" for s in range(a.series)])
            k += 1
            time.sleep(max(0.0, t0 + k - time.monotonic()))
        written = (write_bytes(agent.pid) - w0) * 3600 / (time.monotonic() - t0) / 1e6
        print(f"live: {a.series} points/s in one POST a second for {a.seconds} s "
              f"(fold_every {a.fold_every or 'default'}): written {written:.1f} MB/h")
        frames, owner = wal_frames(os.path.join(work, "data"))
        commits = sum(1 for _, c in frames if c)
        print(f"WAL now: {len(frames)} frames in {commits} commits (since its last reset); frames by owner:")
        counts = collections.Counter(owner.get(p, "page 1 / pointer map / free list") for p, _ in frames)
        for name, n in counts.most_common(12):
            print(f"  {n:7d}  {n / max(1, commits):7.2f} per commit  {name}")
    finally:
        stop(agent)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
