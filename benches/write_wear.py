#!/usr/bin/env python3
"""Bytes the agent writes to disk per hour with many series on a store that is already old.

The device-budget script (scripts/device_budget.py) measures the reference Jetson workload
on a fresh store, where every table is small. A device that has run for a day is different:
its rollup rows and chunk index are keyed by series, so whatever touches every active series
(a rollup fold, indexing the chunk tail) writes about one page per series. This bench makes
that store and measures it:

1. a release agent on a fresh data dir (collectors off, default rollups, retention, sync);
2. `--hours` of history for `--series` series (one point a minute each, past timestamps,
   posted to /write), then a pause while the job folds it;
3. a live phase: one point per series every second (one POST a second), `--seconds` long;
   written bytes from /proc/PID/io `write_bytes`;
4. the WAL's frames at the end, by table and index (SQLite's `dbstat`), per commit.

    python3 benches/write_wear.py                      # 600 series, 24 h, 150 s
    python3 benches/write_wear.py --series 200 --hours 2 --seconds 60

Standard library only; the agent listens on a free port of 127.0.0.1 and is stopped by PID.
"""

import argparse
import collections
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import fleet  # noqa: E402  (free_port, wait_until, http_get, post_all)
from device_budget import write_bytes  # noqa: E402


def post(port, lines):
    fleet.post_all(port, "/write", ["\n".join(lines).encode()])


def wal_frames(data):
    """(page number, commit flag) of each frame of the WAL's current generation, and the
    owner of each page (table or index and page type, from dbstat on a copy)."""
    copy = tempfile.mkdtemp(prefix="wear-copy-")
    try:
        for f in os.listdir(data):
            if f.startswith("edgewatch.db"):
                shutil.copy(os.path.join(data, f), copy)
        wal_path = os.path.join(copy, "edgewatch.db-wal")
        wal = open(wal_path, "rb").read() if os.path.exists(wal_path) else b""
        frames = []
        if len(wal) >= 32:
            page_size, salt = struct.unpack(">I", wal[8:12])[0], wal[16:24]
            off = 32
            while off + 24 + page_size <= len(wal) and wal[off + 8:off + 16] == salt:
                pgno, commit = struct.unpack(">II", wal[off:off + 8])
                frames.append((pgno, commit != 0))
                off += 24 + page_size
        conn = sqlite3.connect(f"file:{copy}/edgewatch.db?mode=ro", uri=True)
        owner = {p: f"{n} ({t})" for n, p, t in conn.execute("SELECT name, pageno, pagetype FROM dbstat")}
        conn.close()
        return frames, owner
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "edgewatch"))
    ap.add_argument("--series", type=int, default=600)
    ap.add_argument("--hours", type=float, default=24.0, help="history before the live phase")
    ap.add_argument("--seconds", type=int, default=150, help="live phase")
    ap.add_argument("--settle", type=int, default=70, help="seconds for the job to fold the history")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"no agent binary at {a.bin}: run `cargo build --release` first")
    work = tempfile.mkdtemp(prefix="edgewatch-wear-")
    port = fleet.free_port()
    cfg = os.path.join(work, "edgewatch.toml")
    with open(cfg, "w") as f:
        f.write(f'[storage]\ndata_dir = "{work}/data"\n[http]\nlisten = "127.0.0.1:{port}"\n'
                "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n")
    log = open(os.path.join(work, "agent.log"), "w")
    agent = subprocess.Popen([a.bin, "run", "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        if not fleet.wait_until(30, lambda: fleet.http_get(base + "/health")[0] == 200):
            sys.exit("the agent did not start: see " + log.name)
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
        print(f"history: {a.series} series x {minutes} minutes posted; settling {a.settle} s", flush=True)
        time.sleep(a.settle)
        w0, t0 = write_bytes(agent.pid), time.monotonic()
        k = 0
        while time.monotonic() - t0 < a.seconds:
            ts = time.time_ns()
            post(port, [f"inference,model=m{s:04d} wall_ms={rnd.uniform(5, 25):.3f} {ts}" for s in range(a.series)])
            k += 1
            time.sleep(max(0.0, t0 + k - time.monotonic()))
        written = (write_bytes(agent.pid) - w0) * 3600 / (time.monotonic() - t0) / 1e6
        print(f"live: {a.series} points/s in one POST a second for {a.seconds} s: written {written:.1f} MB/h")
        frames, owner = wal_frames(os.path.join(work, "data"))
        commits = sum(1 for _, c in frames if c)
        print(f"WAL now: {len(frames)} frames in {commits} commits (since its last reset); frames by owner:")
        counts = collections.Counter(owner.get(p, "page 1 / pointer map / free list") for p, _ in frames)
        for name, n in counts.most_common(12):
            print(f"  {n:7d}  {n / max(1, commits):7.2f} per commit  {name}")
    finally:
        agent.terminate()
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
