#!/usr/bin/env python3
"""Latency of single-point HTTP writes from 1, 8 and 64 concurrent clients, synchronous =
full vs normal, on a given directory (the machine's disk, or a tmpfs to take the sync cost
out). Starts the real agent (BENCH_BIN, default target/release/edgewatch) once per
mode and directory, on a free 127.0.0.1 port, each client on its own keep-alive connection
writing one point per request for SECONDS; prints median and p99 per client count.

Never sends anything outside 127.0.0.1; removes its temp dirs.

    python3 benches/write_latency.py [DIR ...]      (default: a temp dir under /var/tmp)
    BENCH_SECONDS=5 BENCH_BIN=target/debug/edgewatch python3 benches/write_latency.py /dev/shm
"""
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ.get("BENCH_BIN", "target/release/edgewatch")
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))
CLIENTS = [int(c) for c in os.environ.get("CLIENTS", "1,8,64").split(",")]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(base, sync, rollup="[rollup]\nenabled = false\n", env=None):
    """The agent on `base` (config, data, log) with `synchronous = sync`; `rollup` is its
    `[rollup]` section (off by default), `env` its environment. Returns (process, port)."""
    port = free_port()
    data = os.path.join(base, "data")
    cfg = os.path.join(base, "edgewatch.toml")
    with open(cfg, "w") as f:
        f.write(
            f'[http]\nlisten = "127.0.0.1:{port}"\n[udp]\nenabled = false\n'
            f'[storage]\ndata_dir = "{data}"\nsynchronous = "{sync}"\n'
            "[host]\nenabled = false\n[tegrastats]\nenabled = false\n"
            "[nvml]\nenabled = false\n[health]\nenabled = false\n" + rollup
        )
    log = open(os.path.join(base, "agent.log"), "w")
    p = subprocess.Popen([BIN, "run", "--config", cfg], stdout=subprocess.DEVNULL, stderr=log, env=env)
    for _ in range(1200):
        if p.poll() is not None:
            break
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("agent did not start:\n" + open(os.path.join(base, "agent.log")).read())


def client(port, until, out, idx):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    i = 0
    lat = []
    while time.monotonic() < until:
        body = f"lat,c={idx} v={i}i\n".encode()
        t = time.perf_counter()
        c.request("POST", "/write?db=x", body)
        r = c.getresponse()
        r.read()
        lat.append(time.perf_counter() - t)
        if r.status != 204:
            raise SystemExit(f"status {r.status}")
        i += 1
    out.extend(lat)


def run(port, n):
    until = time.monotonic() + SECONDS
    out = []
    ts = [threading.Thread(target=client, args=(port, until, out, k)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.sort()
    return statistics.median(out) * 1e3, out[int(len(out) * 0.99)] * 1e3, len(out) / SECONDS


def main():
    dirs = sys.argv[1:] or ["/var/tmp"]
    print("dir\tsync\tclients\tmedian_ms\tp99_ms\twrites/s")
    for d in dirs:
        for sync in ["normal", "full"]:
            base = tempfile.mkdtemp(prefix="ew-lat-", dir=d)
            try:
                p, port = start(base, sync)
            except SystemExit:
                shutil.rmtree(base, ignore_errors=True)
                raise
            try:
                for n in CLIENTS:
                    med, p99, rate = run(port, n)
                    print(f"{d}\t{sync}\t{n}\t{med:.2f}\t{p99:.2f}\t{rate:.0f}", flush=True)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait()
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
