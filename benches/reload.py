#!/usr/bin/env python3
"""Live reload under load: an agent with 100 alert rules, 5 InfluxDB sinks and 5 scrapes is
reloaded back to back (POST /api/v1/reload) with a file that changes all of them (every
rule's threshold, every sink's max_delay, every scrape's interval: the worst case, each
reload restarts every part) while 8 clients write one point per request. Prints the time to
apply a reload (the request's round trip: read, validate, diff, stop and start the parts)
and the write latency (median, p99) during the reloads against the same clients without
reloads, and checks that no write was refused.

The sinks send to a second edgewatch started here as their InfluxDB 1.x receiver, the
scrapes read that receiver's /metrics: real peers, all on 127.0.0.1. Removes its temp dir.

    python3 benches/reload.py
    BENCH_SECONDS=8 BENCH_BIN=target/debug/edgewatch python3 benches/reload.py
    BENCH_KEEP=1 RUST_LOG=edgewatch::reload=debug,info ...   (keeps the agents' logs)
"""
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

BIN = os.environ.get("BENCH_BIN", "target/release/edgewatch")
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))
CLIENTS = 8


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def base(port, data):
    return (
        f'[http]\nlisten = "127.0.0.1:{port}"\n[udp]\nenabled = false\n'
        f'[storage]\ndata_dir = "{data}"\n'
        "[host]\nenabled = false\n[tegrastats]\nenabled = false\n[nvml]\nenabled = false\n"
        "[jetson]\nenabled = false\n[kmsg]\nenabled = false\n[health]\nenabled = false\n"
    )


def device_config(port, data, gateway, variant):
    """100 rules, 5 sinks, 5 scrapes; `variant` (0 or 1) changes every one of them."""
    t = base(port, data) + '[alerts]\ninterval = "1s"\nbuiltin = false\n'
    for i in range(100):
        t += (
            f'[[alert]]\nname = "R{i}"\nmeasurement = "lat"\nfield = "v"\nagg = "max"\n'
            f'window = "10s"\nop = ">"\nthreshold = {1e9 + i + variant}\nfor = "0s"\n'
        )
    for i in range(5):
        t += (
            f'[[sink]]\ntype = "influxdb"\nname = "s{i}"\nurl = "http://127.0.0.1:{gateway}"\n'
            f'version = 1\ndatabase = "edge"\nmax_delay = "{200 + variant * 100}ms"\n'
        )
    for i in range(5):
        t += (
            f'[[scrape]]\nname = "p{i}"\nurl = "http://127.0.0.1:{gateway}/metrics"\n'
            f'interval = "{2 + variant}s"\n'
        )
    return t


def start(cfg_path, log_path, port):
    log = open(log_path, "w")
    p = subprocess.Popen([BIN, "run", "--config", cfg_path], stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(1200):
        if p.poll() is not None:
            break
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise SystemExit("agent did not start:\n" + open(log_path).read())


def client(port, until, out, refused, idx):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    i = 0
    while time.monotonic() < until:
        body = f"lat,c={idx} v={i}i\n".encode()
        t = time.perf_counter()
        c.request("POST", "/write?db=x", body)
        r = c.getresponse()
        r.read()
        out.append(time.perf_counter() - t)
        if r.status != 204:
            refused.append(r.status)
        i += 1


def writers(port, seconds, during=None):
    until = time.monotonic() + seconds
    out, refused = [], []
    ts = [threading.Thread(target=client, args=(port, until, out, refused, k)) for k in range(CLIENTS)]
    for t in ts:
        t.start()
    extra = during(until) if during else None
    for t in ts:
        t.join()
    out.sort()
    return statistics.median(out) * 1e3, out[int(len(out) * 0.99)] * 1e3, len(out), refused, extra


def main():
    tmp = tempfile.mkdtemp(prefix="ew-reload-", dir="/var/tmp")
    procs = []
    try:
        gport, dport = free_port(), free_port()
        gcfg = os.path.join(tmp, "gateway.toml")
        with open(gcfg, "w") as f:
            f.write(base(gport, os.path.join(tmp, "gw-data")) + "[rollup]\nenabled = false\n")
        procs.append(start(gcfg, os.path.join(tmp, "gateway.log"), gport))
        dcfg = os.path.join(tmp, "device.toml")
        data = os.path.join(tmp, "dev-data")
        with open(dcfg, "w") as f:
            f.write(device_config(dport, data, gport, 0))
        procs.append(start(dcfg, os.path.join(tmp, "device.log"), dport))
        time.sleep(2)
        med0, p990, n0, ref0, _ = writers(dport, SECONDS)

        def reload_loop(until):
            times, variant = [], 0
            c = http.client.HTTPConnection("127.0.0.1", dport, timeout=120)
            while time.monotonic() < until:
                variant ^= 1
                with open(dcfg, "w") as f:
                    f.write(device_config(dport, data, gport, variant))
                t = time.perf_counter()
                c.request("POST", "/api/v1/reload", b"")
                r = c.getresponse()
                body = r.read()
                times.append(time.perf_counter() - t)
                if r.status != 200:
                    raise SystemExit(f"reload answered {r.status}: {body!r}")
            return times

        med1, p991, n1, ref1, times = writers(dport, SECONDS, reload_loop)
        times.sort()
        print(f"reloads: {len(times)} (each changes 100 rules, 5 sinks, 5 scrapes)")
        print(
            f"reload apply ms: median {statistics.median(times) * 1e3:.1f}, "
            f"p99 {times[int(len(times) * 0.99)] * 1e3:.1f}, max {times[-1] * 1e3:.1f}"
        )
        print("phase\twrites\trefused\tmedian_ms\tp99_ms")
        print(f"no reloads\t{n0}\t{len(ref0)}\t{med0:.2f}\t{p990:.2f}")
        print(f"reloading\t{n1}\t{len(ref1)}\t{med1:.2f}\t{p991:.2f}")
        if ref0 or ref1:
            raise SystemExit(f"writes refused: {ref0 + ref1}")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait()
        if os.environ.get("BENCH_KEEP"):
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
