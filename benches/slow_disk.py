#!/usr/bin/env python3
"""Does the rollup job starve ingest on a slow disk? Runs the real agent (BENCH_BIN, default
target/release/edgewatch) with `synchronous = "full"` on a slow disk emulated in its own
process (benches/slow_disk/slow_sync.c, LD_PRELOADed: each fsync/fdatasync waits
SLOW_SYNC_US, default 10 ms, like a managed-flash cache flush; each pwrite SLOW_WRITE_US,
default 200 us), under a device-like background load (a batch of LOAD_POINTS points over
LOAD_SERIES series every 100 ms: collectors), and measures single-point HTTP writes from
1 and 8 clients (an app reporting every inference) with the rollup job off, then on with
`interval = "1s"` (30x its default rate, so a fold runs during nearly every second of the
probe), alternating ROUNDS times (default 2: the machine's noise shows as the spread between
rounds). Prints median / p99 / max per cell and the rollup job's progress.

Never sends anything outside 127.0.0.1; removes its temp dirs. Needs a C compiler (cc).

    python3 benches/slow_disk.py            BENCH_SECONDS=10 SLOW_SYNC_US=20000 ...
"""
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import write_latency  # noqa: E402  (the agent start and free ports, shared)

SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
CLIENTS = [int(c) for c in os.environ.get("CLIENTS", "1,8").split(",")]
LOAD_POINTS = int(os.environ.get("LOAD_POINTS", "500"))
LOAD_SERIES = int(os.environ.get("LOAD_SERIES", "200"))


def build_shim(base):
    so = os.path.join(base, "slow_sync.so")
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(HERE, "slow_disk", "slow_sync.c"), "-ldl"],
        check=True,
    )
    return so


def start(base, shim, rollup):
    section = (
        f"[rollup]\nenabled = {'true' if rollup else 'false'}\n"
        f"interval = \"{os.environ.get('ROLLUP_INTERVAL', '1s')}\"\n"
        + os.environ.get("EXTRA_CONFIG", "").replace("\\n", "\n")
    )
    return write_latency.start(base, "full", rollup=section, env=dict(os.environ, LD_PRELOAD=shim))


def loader(port, stop):
    """A device's collectors: LOAD_POINTS points over LOAD_SERIES series every 100 ms."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    rnd = random.Random(1)
    while not stop.is_set():
        t0 = time.monotonic()
        now = time.time_ns()
        body = "".join(
            f"load,s={i % LOAD_SERIES} v={rnd.random() * 100:.2f} {now + i}\n" for i in range(LOAD_POINTS)
        ).encode()
        c.request("POST", "/write?db=x", body)
        r = c.getresponse()
        r.read()
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))


def client(port, until, out, idx):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    i = 0
    lat = []
    while time.monotonic() < until:
        body = f"inference,model=m{idx} wall_ms={i % 50}.5\n".encode()
        t = time.perf_counter()
        c.request("POST", "/write?db=x", body)
        r = c.getresponse()
        r.read()
        lat.append(time.perf_counter() - t)
        if r.status != 204:
            raise SystemExit(f"status {r.status}")
        i += 1
    out.extend(lat)


def probe(port, n):
    until = time.monotonic() + SECONDS
    out = []
    ts = [threading.Thread(target=client, args=(port, until, out, k)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.sort()
    return statistics.median(out) * 1e3, out[int(len(out) * 0.99)] * 1e3, out[-1] * 1e3, len(out) / SECONDS


def status(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/api/v1/status")
    return json.loads(c.getresponse().read())


def main():
    base = tempfile.mkdtemp(prefix="ew-slow-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    try:
        shim = build_shim(base)
        sync_us = os.environ.get("SLOW_SYNC_US", "10000")
        write_us = os.environ.get("SLOW_WRITE_US", "200")
        print(f"# slow disk: sync {sync_us} us, pwrite {write_us} us; load {LOAD_POINTS * 10} points/s over {LOAD_SERIES} series")
        print("rollup\tclients\tmedian_ms\tp99_ms\tmax_ms\twrites/s")
        rounds = int(os.environ.get("ROUNDS", "2"))
        for k, rollup in enumerate([False, True] * rounds):
            d = os.path.join(base, f"{k}-{'on' if rollup else 'off'}")
            os.makedirs(d)
            p, port = start(d, shim, rollup)
            stop = threading.Event()
            ld = threading.Thread(target=loader, args=(port, stop))
            ld.start()
            try:
                time.sleep(2.0)  # a backlog for the first fold
                for n in CLIENTS:
                    med, p99, mx, rate = probe(port, n)
                    print(f"{'on' if rollup else 'off'}\t{n}\t{med:.2f}\t{p99:.2f}\t{mx:.1f}\t{rate:.0f}", flush=True)
                st = status(port)
                ro = st.get("rollup") or {}
                tiers = [(t["name"], t.get("pending_chunks")) for t in ro.get("tiers", [])]
                print(f"# rollup={'on' if rollup else 'off'}: points_written {st['ingest']['points_written']}, "
                      f"commit_errors {st['ingest'].get('commit_errors')}, tiers pending chunks {tiers}")
            finally:
                stop.set()
                ld.join()
                p.send_signal(signal.SIGTERM)
                p.wait()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
