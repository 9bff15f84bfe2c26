#!/usr/bin/env python3
"""Bytes on the wire per hour of a reference device, per sink type and forwarding mode.

The reference device: tegrastats at 1 Hz and the host collector every 10 s (their series and
fields taken from the real agent: it runs once with its host collector and a recorded AGX
Orin tegrastats log replayed, and its stored series are read back), plus 30 inferences/s
(two models at 15/s, four fields each). One hour of that is written, with past timestamps,
to a fresh agent whose sink is down; then the receiver comes up behind a counting TCP proxy
on loopback and the agent drains. The proxy counts the TCP payload bytes in each direction
(device -> receiver is what a metered uplink bills; the receiver's answers are shown too).

Receivers are real: InfluxDB 1.x (`influxd`) and mosquitto. Sink types (`--sinks`):
influxdb-gzip, influxdb-plain, mqtt-line, mqtt-line-gzip, mqtt-json; modes (`--modes`): raw, rollup:1m.
Each sink type is one entry of SINKS below (receiver + sink keys): a new sink type (e.g.
`prometheus_remote_write` against VictoriaMetrics) is one more entry and one receiver.

Run: `python3 benches/wire_bytes.py [--bin target/debug/edgewatch] [--sinks ...] [--modes ...]`
(build first: `cargo build`; any profile: the bytes do not depend on it).
"""

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = 1_000_000_000
# Every process started here, stopped (by its own PID) however the run ends.
CHILDREN = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(pred, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = pred()
            if v:
                return v
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"timed out waiting for {what}")


def http(method, url, body=None):
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Agent:
    def __init__(self, binary, work, config):
        self.port = free_port()
        self.data = os.path.join(work, "data")
        os.makedirs(work, exist_ok=True)
        cfg = os.path.join(work, "edgewatch.toml")
        with open(cfg, "w") as f:
            f.write(config.replace("@LISTEN@", f"127.0.0.1:{self.port}").replace("@DATA@", self.data))
        self.log = open(os.path.join(work, "agent.log"), "w")
        self.proc = subprocess.Popen([binary, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                                     stderr=self.log, env={**os.environ, "RUST_LOG": "info"})
        CHILDREN.append(self.proc)
        wait(lambda: http("GET", self.url("/health"))[0] == 200, 20, "the agent")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path):
        code, body = http("GET", self.url(path))
        assert code == 200, body
        return json.loads(body)

    def write(self, lines):
        for i in range(0, len(lines), 5000):
            code, body = http("POST", self.url("/write?db=x"), "".join(lines[i:i + 5000]).encode())
            assert code == 204, body

    def sink(self):
        return self.get("/api/v1/status")["forward"]["sinks"][0]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


QUIET = """[http]
listen = "@LISTEN@"
[udp]
enabled = false
[storage]
data_dir = "@DATA@"
[tegrastats]
enabled = false
[nvml]
enabled = false
[jetson]
enabled = false
[health]
enabled = false
"""


def newest_sample(binary, work):
    """(tegrastats series, host series): per series key its fields and last values."""
    log = os.path.join(ROOT, "tests/data/tegrastats/agx-orin-jp6.log")
    cfg = QUIET.replace("[tegrastats]\nenabled = false\n",
                        f"[tegrastats]\nenabled = true\npath = \"/nonexistent\"\nreplay = \"{log}\"\ninterval = \"1s\"\n")
    cfg = cfg.replace("[nvml]", "[host]\nenabled = true\ninterval = \"10s\"\n[rollup]\nenabled = false\n[nvml]")
    a = Agent(binary, work, cfg)
    # Two host samples (the first has no CPU deltas yet) and twenty tegrastats ones.
    time.sleep(22)
    now = time.time_ns()
    shapes = {"tegrastats": {}, "host": {}}
    meas = a.get("/api/v1/fields")
    names = sorted({m["measurement"] for m in meas.get("fields", meas if isinstance(meas, list) else [])})
    for m in names:
        q = urllib.parse.urlencode({"measurement": m, "from": now - 30 * NS, "to": now + NS})
        res = a.get(f"/api/v1/query?{q}")
        for s in res["series"]:
            if not s["points"]:
                continue
            if m in ("host", "thermal") or m.startswith("host_"):
                kind = "host"
            elif m.startswith("jetson_"):
                kind = "tegrastats"
            else:
                continue
            key = (m, tuple(sorted(s["tags"].items())))
            shapes[kind].setdefault(key, {})[s["field"]] = s["points"][-1][1]
    a.stop()
    return shapes


def esc(s, chars):
    for c in "\\" + chars:
        s = s.replace(c, "\\" + c)
    return s


def line(m, tags, fields, ts):
    head = esc(m, ", ") + "".join(f",{esc(k, ',= ')}={esc(v, ',= ')}" for k, v in tags)
    parts = []
    for k, v in fields.items():
        if isinstance(v, bool):
            val = "true" if v else "false"
        elif isinstance(v, int):
            val = f"{v}i"
        elif isinstance(v, float):
            val = repr(v)
        else:
            val = '"' + str(v).replace('"', '\\"') + '"'
        parts.append(f"{esc(k, ',= ')}={val}")
    return f"{head} {','.join(parts)} {ts}\n"


def jiggle(v, rng):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    if isinstance(v, int):
        return v + rng.choice((-1, 0, 0, 1)) if abs(v) > 10 else v
    return round(v * (1 + rng.uniform(-0.03, 0.03)), 3)


def reference_hour(shapes, t0):
    """One hour of the reference device from `t0` (ns, a minute boundary), as lines."""
    rng = random.Random(20261203)
    out = []
    for s in range(3600):
        ts = t0 + s * NS
        for (m, tags), fields in shapes["tegrastats"].items():
            out.append(line(m, tags, {k: jiggle(v, rng) for k, v in fields.items()}, ts))
        if s % 10 == 0:
            for (m, tags), fields in shapes["host"].items():
                out.append(line(m, tags, {k: jiggle(v, rng) for k, v in fields.items()}, ts))
        for k in range(30):
            model = ("yolov8n", "resnet50")[k % 2]
            wall = round(rng.lognormvariate(2.3 if k % 2 == 0 else 2.9, 0.25), 3)
            out.append(line("inference", [("app", "camera-0"), ("model", model), ("stage", "infer")],
                            {"wall_ms": wall, "gpu_ms": round(wall * 0.7, 3),
                             "queue_ms": round(rng.uniform(0, 3), 3), "batch_size": 1},
                            ts + k * NS // 30 + rng.randrange(1000)))
    return out


class CountingProxy:
    """Loopback TCP proxy to `upstream`; counts payload bytes each way."""

    def __init__(self, port, upstream):
        self.up = 0
        self.down = 0
        self.lock = threading.Lock()
        self.upstream = upstream
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", port))
        self.srv.listen(64)
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self.pipe, args=(c, u, "up"), daemon=True).start()
            threading.Thread(target=self.pipe, args=(u, c, "down"), daemon=True).start()

    def pipe(self, a, b, way):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                with self.lock:
                    setattr(self, way, getattr(self, way) + len(d))
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def start_influxd(work):
    port, rpc = free_port(), free_port()
    os.makedirs(work, exist_ok=True)
    cfg = os.path.join(work, "influxdb.conf")
    with open(cfg, "w") as f:
        f.write(f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc}"
[meta]
  dir = "{work}/meta"
[data]
  dir = "{work}/data"
  wal-dir = "{work}/wal"
  query-log-enabled = false
[http]
  bind-address = "127.0.0.1:{port}"
  log-enabled = false
  max-body-size = 0
[monitor]
  store-enabled = false
[continuous_queries]
  enabled = false
""")
    p = subprocess.Popen(["influxd", "-config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    CHILDREN.append(p)
    wait(lambda: http("GET", f"http://127.0.0.1:{port}/ping")[0] == 204, 30, "influxd")
    http("POST", f"http://127.0.0.1:{port}/query?" + urllib.parse.urlencode({"q": "CREATE DATABASE edge"}))
    return p, port


def start_mosquitto(work):
    port = free_port()
    os.makedirs(work, exist_ok=True)
    cfg = os.path.join(work, "mosquitto.conf")
    with open(cfg, "w") as f:
        f.write(f"user root\nlistener {port} 127.0.0.1\nallow_anonymous true\n")
    p = subprocess.Popen(["mosquitto", "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    CHILDREN.append(p)
    wait(lambda: socket.create_connection(("127.0.0.1", port)), 10, "mosquitto")
    return p, port


def start_victoriametrics(work):
    port = free_port()
    os.makedirs(work, exist_ok=True)
    p = subprocess.Popen(["victoria-metrics", f"-httpListenAddr=127.0.0.1:{port}",
                          f"-storageDataPath={work}/vm", "-retentionPeriod=100y"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    CHILDREN.append(p)
    wait(lambda: http("GET", f"http://127.0.0.1:{port}/health")[0] == 200, 30, "victoria-metrics")
    return p, port


# Sink types: the receiver to start and the sink's keys (`@PORT@`: the proxy's port).
# A new sink type is one more entry here.
SINKS = {
    "influxdb-gzip": (start_influxd, 'type = "influxdb"\nurl = "http://127.0.0.1:@PORT@"\nversion = 1\ndatabase = "edge"\ngzip = true\n'),
    "influxdb-plain": (start_influxd, 'type = "influxdb"\nurl = "http://127.0.0.1:@PORT@"\nversion = 1\ndatabase = "edge"\ngzip = false\n'),
    "mqtt-line": (start_mosquitto, 'type = "mqtt"\nurl = "mqtt://127.0.0.1:@PORT@"\ntopic = "ew/{device_id}"\nformat = "line"\n'),
    "mqtt-line-gzip": (start_mosquitto, 'type = "mqtt"\nurl = "mqtt://127.0.0.1:@PORT@"\ntopic = "ew/{device_id}"\nformat = "line"\ngzip = true\n'),
    "remote-write": (start_victoriametrics, 'type = "prometheus_remote_write"\nurl = "http://127.0.0.1:@PORT@/api/v1/write"\n'),
    # Histograms on (docs/forwarding.md "Histograms"): the points plus the latency sketches.
    "remote-write-hist-native": (start_victoriametrics, 'type = "prometheus_remote_write"\nurl = "http://127.0.0.1:@PORT@/api/v1/write"\nhistograms = true\n'),
    "remote-write-hist-vmrange": (start_victoriametrics, 'type = "prometheus_remote_write"\nurl = "http://127.0.0.1:@PORT@/api/v1/write"\nhistograms = true\nhistogram_format = "vmrange"\n'),
    "influxdb-gzip-hist": (start_influxd, 'type = "influxdb"\nurl = "http://127.0.0.1:@PORT@"\nversion = 1\ndatabase = "edge"\ngzip = true\nhistograms = true\n'),
    "mqtt-json": (start_mosquitto, 'type = "mqtt"\nurl = "mqtt://127.0.0.1:@PORT@"\ntopic = "ew/{device_id}"\nformat = "json"\n'),
}


def measure(binary, work, sink, mode, hour, marker):
    start_rx, keys = SINKS[sink]
    proxy_port = free_port()
    cfg = QUIET + '[host]\nenabled = false\n[rollup]\nenabled = true\ninterval = "1s"\nlateness = "1m"\n'
    cfg = cfg.replace("[http]", 'device_id = "ref-1"\n[http]', 1)
    # Default batching (max_points 5000, max_delay 1 s); the receiver is down while writing.
    cfg += '[[sink]]\nname = "s"\nforward = "' + mode + '"\nreconnect_jitter = "0s"\n' \
        'min_backoff = "100ms"\nmax_backoff = "500ms"\n' + keys.replace("@PORT@", str(proxy_port))
    a = Agent(binary, os.path.join(work, "agent"), cfg)
    a.write(hour)
    if mode != "raw":
        a.write([marker])
    # Everything stored (raw: the backlog holds every point) or rolled up.
    def ready():
        s = a.sink()
        return s["backlog_points"] > 0 and (mode == "raw" or s["backlog_chunks"] >= 60)
    wait(ready, 120, "the backlog")
    rx, rx_port = start_rx(os.path.join(work, "rx"))
    proxy = CountingProxy(proxy_port, rx_port)
    t = time.time()
    last = [None, time.time()]

    def drained():
        s = a.sink()
        key = (s["forwarded_points"], proxy.up)
        if key != last[0]:
            last[0], last[1] = key, time.time()
        return s["backlog_points"] == 0 and s["forwarded_points"] > 0 and time.time() - last[1] > 2.0 and s
    s = wait(drained, 600, f"{sink} {mode} to drain")
    secs = time.time() - t - 2.0
    a.stop()
    rx.terminate()
    rx.wait()
    return {"sink": sink, "mode": mode, "points": s["forwarded_points"], "up_bytes": proxy.up,
            "down_bytes": proxy.down, "drain_s": round(secs, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "debug", "edgewatch"))
    ap.add_argument("--sinks", default=",".join(SINKS))
    ap.add_argument("--modes", default="raw,rollup:1m")
    args = ap.parse_args()
    for need in ("influxd", "mosquitto"):
        if not shutil.which(need):
            sys.exit(f"{need} not found (apt-get install {'influxdb' if need == 'influxd' else 'mosquitto'})")
    work = tempfile.mkdtemp(prefix="wire-bytes-")
    try:
        shapes = newest_sample(args.bin, os.path.join(work, "shape"))
        t0 = (time.time_ns() // (60 * NS) - 75) * 60 * NS
        hour = reference_hour(shapes, t0)
        marker = f"wire_marker v=1i {time.time_ns()}\n"
        nseries = sum(len(f) for f in shapes["tegrastats"].values()), sum(len(f) for f in shapes["host"].values())
        print(f"reference hour: {len(hour)} lines; tegrastats {len(shapes['tegrastats'])} series keys / "
              f"{nseries[0]} fields at 1 Hz, host {len(shapes['host'])} / {nseries[1]} at 0.1 Hz, "
              f"inference 2 models x 15/s x 4 fields")
        print(f"{'sink':16} {'mode':10} {'points':>8} {'up MB/h':>9} {'down MB/h':>9} {'B/point':>8}")
        rows = []
        for sink in args.sinks.split(","):
            for mode in args.modes.split(","):
                r = measure(args.bin, os.path.join(work, f"{sink}-{mode}".replace(":", "")), sink, mode, hour, marker)
                rows.append(r)
                print(f"{sink:16} {mode:10} {r['points']:>8} {r['up_bytes'] / 1e6:>9.3f} "
                      f"{r['down_bytes'] / 1e6:>9.3f} {r['up_bytes'] / max(r['points'], 1):>8.1f}", flush=True)
        print(json.dumps(rows))
    finally:
        for p in CHILDREN:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
