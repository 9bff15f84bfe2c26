#!/usr/bin/env python3
"""Fleet simulation: N real edgewatch agents on loopback reconnect to one receiver at once.

Each agent (its own data dir, `device_id = dev-NNN`, its own free port, collectors and the
rollup job off) is started with one sink pointing at a receiver that is not running yet,
and is handed a backlog through its own `/write` with past timestamps: by default one hour
of the reference device (tegrastats at 1 Hz, the host collector every 10 s, the [jetson]
throttle sample every 5 s, 30 inferences/s), with the real measurement, tag and field
names. Then the receiver comes up and every agent drains into it at once. The script checks
that every device's points arrived exactly once (a count per device and measurement on the
receiver equal to what was written, and on the agents: every point acknowledged, none
resent) and reports the time to drain the whole fleet against the receiver's own
single-connection ingest rate of the same data, the peak number of receiver connections,
the sinks' errors (429/503 among them), and the agents' summed CPU and RSS.

    python3 scripts/fleet.py                       # N = 100, 1 h backlog, InfluxDB 1.x
    python3 scripts/fleet.py --agents 10 --backlog 300 --bin target/release/edgewatch
    python3 scripts/fleet.py --receiver victoriametrics   # needs the prometheus_remote_write sink
    python3 scripts/fleet.py --receiver victoriametrics --vm-sink influxdb   # line protocol to VM

Standard library only. It never targets an address outside 127.0.0.1, and stops every
process it started by PID. Exit status 0 only when every count matched.
"""

import argparse
import concurrent.futures
import gzip
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The Jetson modules the fleet mixes: identity tags as the [jetson] collector writes them
# (docs/collectors.md "Jetson state and throttling"), the CPU cores, thermal zones and power rails
# tegrastats prints on each, and the models its apps run.
MODULES = [
    {
        "tags": "jetpack=6.2,jetson_clocks=off,l4t=36.4.3,"
        "module=NVIDIA\\ Jetson\\ Orin\\ Nano\\ Engineering\\ Reference\\ Developer\\ Kit\\ Super,"
        "power_mode=MAXN_SUPER,power_mode_id=2",
        "cores": 6,
        "zones": ["cpu", "gpu", "soc0", "soc1", "soc2", "tj"],
        "rails": ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"],
        "models": [("yolov8n", "3"), ("resnet50", "1")],
    },
    {
        "tags": "jetpack=5.1.2,jetson_clocks=on,l4t=35.4.1,"
        "module=Jetson\\ AGX\\ Orin,power_mode=MAXN,power_mode_id=0",
        "cores": 12,
        "zones": ["cpu", "gpu", "cv0", "cv1", "cv2", "soc0", "soc1", "soc2", "tj"],
        "rails": ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"],
        "models": [("yolov8m", "2"), ("resnet50", "1"), ("segformer", "5")],
    },
    {
        "tags": "jetpack=5.1.2,jetson_clocks=off,l4t=35.4.1,"
        "module=NVIDIA\\ Jetson\\ Xavier\\ NX\\ Developer\\ Kit,power_mode=MODE_20W_6CORE,power_mode_id=8",
        "cores": 6,
        "zones": ["cpu", "gpu", "aux", "ao", "tj"],
        "rails": ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"],
        "models": [("yolov8n", "3")],
    },
]

# Per measurement, a field every written line of it carries: the receiver counts it.
COUNT_FIELD = {
    "inference": "wall_ms",
    "jetson_mem": "ram_used_mb",
    "jetson_cpu": "load_pct",
    "jetson_emc": "load_pct",
    "jetson_gpu": "load_pct",
    "jetson_engine": "on",
    "jetson_temp": "temp_c",
    "jetson_power": "current_mw",
    "jetson_throttle": "gpu_freq_mhz",
    "host": "cpu_pct",
    "host_cpu": "usage_pct",
    "thermal": "temp_c",
}


class Wave:
    """Cheap deterministic values: no `random`, so two runs write the same data."""

    def __init__(self, seed):
        self.x = seed * 2654435761 % 4294967296 or 1

    def next(self, lo, hi):
        self.x = (self.x * 1103515245 + 12345) % 2147483648
        return lo + (hi - lo) * self.x / 2147483648


def backlog_lines(module, start_ns, seconds, inference_rate):
    """Yields (measurement, line) for `seconds` of the reference device from `start_ns`."""
    w = Wave(len(module["tags"]))
    ident = module["tags"]
    cores = module["cores"]
    models = module["models"]
    step = 1_000_000_000 // max(inference_rate, 1)
    n = 0
    for s in range(seconds):
        t = start_ns + s * 1_000_000_000
        # tegrastats, 1 Hz
        used = w.next(2900, 3400)
        yield "jetson_mem", f"jetson_mem,{ident} ram_used_mb={used:.0f},ram_total_mb=7620,ram_used_pct={used / 76.2:.2f},swap_used_mb=0,swap_total_mb=3810,lfb_blocks=4i,lfb_block_mb=4 {t}"
        yield "jetson_cpu", f"jetson_cpu,{ident} cores={cores}i,cores_online={cores}i,load_pct={w.next(10, 60):.1f} {t}"
        for c in range(cores):
            yield "jetson_cpu", f"jetson_cpu,core={c},{ident} online=true,load_pct={w.next(0, 90):.0f},freq_mhz=1728 {t}"
        yield "jetson_emc", f"jetson_emc,{ident} load_pct={w.next(5, 40):.0f},freq_mhz=2133 {t}"
        gpu = w.next(30, 99)
        yield "jetson_gpu", f"jetson_gpu,{ident} load_pct={gpu:.0f},freq_mhz=1020 {t}"
        for e in ("NVENC", "NVDEC", "VIC"):
            yield "jetson_engine", f"jetson_engine,engine={e},{ident} on=false {t}"
        for z in module["zones"]:
            yield "jetson_temp", f"jetson_temp,{ident},zone={z} temp_c={w.next(45, 72):.2f} {t}"
        for r in module["rails"]:
            mw = w.next(800, 7000)
            yield "jetson_power", f"jetson_power,{ident},rail={r} current_mw={mw:.0f}i,average_mw={mw * 0.97:.0f}i {t}"
        # [jetson] throttle sample, every 5 s
        if s % 5 == 0:
            yield "jetson_throttle", f"jetson_throttle,{ident} gpu_freq_mhz=1020,gpu_max_mhz=1020,gpu_hw_max_mhz=1020,gpu_capped=false,cpu_freq_mhz=1728,cpu_max_mhz=1728,cpu_hw_max_mhz=1728,cpu_capped=false,thermal_trips=0i,oc_events=0i,current_alarms=0i,power_mode_id=2i,throttled=false {t}"
        # host collector, every 10 s
        if s % 10 == 0:
            yield "host", f"host cpu_pct={w.next(10, 60):.1f},mem_total_mb=7620,mem_used_mb={used:.0f},mem_available_mb={7620 - used:.0f},mem_used_pct={used / 76.2:.2f},load1={w.next(0, 4):.2f},load5=1.2,load15=1.1,uptime_s={s}i,procs_running=3i {t}"
            for c in range(cores):
                yield "host_cpu", f"host_cpu,core={c} usage_pct={w.next(0, 90):.1f} {t}"
            for z in module["zones"][:4]:
                yield "thermal", f"thermal,sensor=thermal_zone{module['zones'].index(z)},zone={z}-thermal temp_c={w.next(45, 72):.1f} {t}"
        # inference_rate inferences per second, round-robin over the device's models
        for k in range(inference_rate):
            model, version = models[n % len(models)]
            n += 1
            wall = w.next(8, 30)
            ok = "false" if n % 997 == 0 else "true"
            yield "inference", f"inference,app=camera,model={model},model_version={version} wall_ms={wall:.2f},gpu_ms={wall * 0.62:.2f},queue_ms={w.next(0.1, 3):.2f},batch_size=1i,ok={ok} {t + k * step}"


def with_tags(line, tags):
    """`line` with `tags` (`,k=v,...`) added where its tag set ends (the first unescaped space)."""
    i = 0
    while True:
        i = line.index(" ", i)
        if line[i - 1] != "\\":
            return line[:i] + tags + line[i:]
        i += 1


def make_backlog(module, start_ns, seconds, inference_rate, batch_lines):
    """(bodies of `batch_lines` lines, lines per measurement and `_values`: field values)."""
    bodies, counts, buf = [], {}, []
    for m, line in backlog_lines(module, start_ns, seconds, inference_rate):
        counts[m] = counts.get(m, 0) + 1
        counts["_values"] = counts.get("_values", 0) + line.rsplit(" ", 2)[-2].count(",") + 1
        buf.append(line)
        if len(buf) == batch_lines:
            bodies.append(("\n".join(buf) + "\n").encode())
            buf = []
    if buf:
        bodies.append(("\n".join(buf) + "\n").encode())
    return bodies, counts


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(timeout, f, interval=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = f()
        if v:
            return v
        time.sleep(interval)
    return None


def http_get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def post_all(port, path, bodies, gzipped=False):
    """Posts every body on one keep-alive connection; returns the seconds it took."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t = time.monotonic()
    for body in bodies:
        headers = {"Content-Type": "text/plain"}
        if gzipped:
            body = gzip.compress(body, 1)
            headers["Content-Encoding"] = "gzip"
        for _attempt in range(100):
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            text = r.read()
            if r.status == 503:  # the agent's queue is full: honour Retry-After, briefly
                time.sleep(0.05)
                continue
            if r.status not in (200, 204):
                raise SystemExit(f"POST {path} on :{port}: HTTP {r.status}: {text[:300]!r}")
            break
        else:
            raise SystemExit(f"POST {path} on :{port}: still 503 after 100 attempts")
    conn.close()
    return time.monotonic() - t


# --- process bookkeeping -------------------------------------------------------------

def proc_cpu_s(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak_rss(pid):
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def established_on(port):
    """Established TCP connections whose local port is `port` (the server's side)."""
    n = 0
    hexport = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[1].endswith(hexport) and parts[3] == "01":
                        n += 1
        except OSError:
            pass
    return n


class Sampler(threading.Thread):
    """Every 100 ms: the receiver's established connections and the agents' summed RSS."""

    def __init__(self, port, pids):
        super().__init__(daemon=True)
        self.port, self.pids = port, pids
        self.peak_conns = 0
        self.peak_rss_kb = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak_conns = max(self.peak_conns, established_on(self.port))
            self.peak_rss_kb = max(self.peak_rss_kb, sum(proc_kb(p, "VmRSS") for p in self.pids))
            self.stop.wait(0.1)


# --- receivers -------------------------------------------------------------------------

class Influxd:
    """InfluxDB 1.x (`influxd`, Debian `influxdb`) in `dir` on 127.0.0.1:`port`."""

    kind = "influxdb"

    def __init__(self, dir, port):
        self.dir, self.port, self.proc = dir, port, None
        os.makedirs(dir, exist_ok=True)

    def sink(self, name, backoff):
        return (
            f'[[sink]]\ntype = "influxdb"\nname = "{name}"\nurl = "http://127.0.0.1:{self.port}"\n'
            f'version = 1\ndatabase = "fleet"\nmin_backoff = "{backoff[0]}"\nmax_backoff = "{backoff[1]}"\n'
            f'timeout = "{backoff[2]}"\n'
        )

    def start(self, port=None):
        port = port or self.port
        cfg = os.path.join(self.dir, "influxdb.conf")
        with open(cfg, "w") as f:
            f.write(
                f'reporting-disabled = true\nbind-address = "127.0.0.1:{free_port()}"\n'
                f'[meta]\n  dir = "{self.dir}/meta"\n'
                f'[data]\n  dir = "{self.dir}/data"\n  wal-dir = "{self.dir}/wal"\n  query-log-enabled = false\n'
                f'[http]\n  bind-address = "127.0.0.1:{port}"\n  log-enabled = false\n  max-body-size = 0\n'
                f'[monitor]\n  store-enabled = false\n[continuous_queries]\n  enabled = false\n'
            )
        log = open(os.path.join(self.dir, "influxd.log"), "ab")
        try:
            self.proc = subprocess.Popen(["influxd", "-config", cfg], stdout=log, stderr=log)
        except FileNotFoundError:
            raise SystemExit("influxd not found: apt-get install influxdb")
        if not wait_until(30, lambda: http_get(f"http://127.0.0.1:{port}/ping")[0] == 204):
            raise SystemExit("influxd did not start; see " + os.path.join(self.dir, "influxd.log"))
        self.live_port = port

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def query(self, q, db="fleet"):
        data = urllib.parse.urlencode({"db": db, "q": q}).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.live_port}/query", data, timeout=300) as r:
            return json.loads(r.read())

    def prepare(self):
        """The database exists before the agents' first attempt: created on another port."""
        self.start(free_port())
        self.query("CREATE DATABASE fleet")
        self.stop()

    def ingest_path(self, db):
        return f"/write?db={db}"

    def create(self, db):
        self.query(f"CREATE DATABASE {db}")

    def received(self):
        """(what the receiver accepted over HTTP since it started, in the unit `unit`):
        InfluxDB counts every point it was sent, a duplicate too (which then overwrites
        itself in storage): more than was written means something was sent twice."""
        r = self.query("SHOW STATS FOR 'httpd'")
        s = r["results"][0]["series"][0]
        return s["values"][0][s["columns"].index("pointsWrittenOK")]

    unit = "points"

    def counts(self, measurements, seconds):
        """{device_id: {measurement: points}}."""
        out = {}
        for m in measurements:
            r = self.query(f'SELECT count("{COUNT_FIELD[m]}") FROM "{m}" GROUP BY "device_id"')
            res = r["results"][0]
            if "error" in res:
                raise SystemExit(f"InfluxQL error on {m}: {res['error']}")
            for s in res.get("series", []):
                out.setdefault(s["tags"]["device_id"], {})[m] = s["values"][0][1]
        return out


class VictoriaMetrics:
    """VictoriaMetrics single node (`/usr/bin/victoria-metrics`, Debian `victoria-metrics`).

    Agents send remote write 1.0 to `/api/v1/write` through the `prometheus_remote_write`
    sink (series `<measurement>_<field>`, labels = tags + device_id). The single-connection
    baseline posts the same data as line protocol to its InfluxDB-compatible `/write`.
    """

    kind = "victoriametrics"

    def __init__(self, dir, port):
        self.dir, self.port, self.proc = dir, port, None
        os.makedirs(dir, exist_ok=True)

    # `--vm-sink influxdb` sends line protocol to VictoriaMetrics' `/write` through the
    # influxdb sink instead (the same series names and labels on VictoriaMetrics' side).
    sink_type = "prometheus_remote_write"

    def sink(self, name, backoff):
        if self.sink_type == "influxdb":
            return (
                f'[[sink]]\ntype = "influxdb"\nname = "{name}"\nurl = "http://127.0.0.1:{self.port}"\n'
                f'version = 1\ndatabase = "fleet"\n'
                f'min_backoff = "{backoff[0]}"\nmax_backoff = "{backoff[1]}"\ntimeout = "{backoff[2]}"\n'
            )
        return (
            f'[[sink]]\ntype = "prometheus_remote_write"\nname = "{name}"\n'
            f'url = "http://127.0.0.1:{self.port}/api/v1/write"\n'
            f'min_backoff = "{backoff[0]}"\nmax_backoff = "{backoff[1]}"\ntimeout = "{backoff[2]}"\n'
        )

    def start(self, port=None):
        port = port or self.port
        exe = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
        log = open(os.path.join(self.dir, "victoria-metrics.log"), "ab")
        try:
            self.proc = subprocess.Popen(
                [exe, f"-storageDataPath={self.dir}/data", f"-httpListenAddr=127.0.0.1:{port}",
                 "-retentionPeriod=100y", "-search.latencyOffset=0s"],
                stdout=log, stderr=log)
        except FileNotFoundError:
            raise SystemExit("victoria-metrics not found: apt-get install victoria-metrics")
        if not wait_until(30, lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200):
            raise SystemExit("victoria-metrics did not start")
        self.live_port = port

    stop = Influxd.stop

    def prepare(self):
        pass

    def ingest_path(self, db):
        return f"/write?db={db}"

    def create(self, db):
        pass

    def received(self):
        """Samples accepted through remote write since start (every one, a duplicate too)."""
        code, body = http_get(f"http://127.0.0.1:{self.live_port}/metrics")
        for line in body.splitlines():
            kind = "influx" if self.sink_type == "influxdb" else "promremotewrite"
            if line.startswith(f'vm_rows_inserted_total{{type="{kind}"}}'):
                return int(float(line.split()[-1]))
        return 0

    unit = "_values"

    def counts(self, measurements, seconds):
        # Make what was just written searchable, then count samples per device over a
        # window that covers the whole backlog.
        http_get(f"http://127.0.0.1:{self.live_port}/internal/force_flush")
        out = {}
        for m in measurements:
            q = f'sum by (device_id) (count_over_time({{__name__="{m}_{COUNT_FIELD[m]}",device_id=~"dev-.*"}}[{seconds + 3600}s]))'
            url = f"http://127.0.0.1:{self.live_port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            code, body = http_get(url, timeout=300)
            if code != 200:
                raise SystemExit(f"PromQL error on {m}: {code} {body[:300]}")
            for r in json.loads(body)["data"]["result"]:
                out.setdefault(r["metric"]["device_id"], {})[m] = int(float(r["value"][1]))
        return out


# --- agents ----------------------------------------------------------------------------

class Agent:
    def __init__(self, binary, dir, device_id, sink):
        self.dir, self.device_id = dir, device_id
        self.port = free_port()
        os.makedirs(dir, exist_ok=True)
        cfg = os.path.join(dir, "edgewatch.toml")
        with open(cfg, "w") as f:
            f.write(
                f'device_id = "{device_id}"\n[tags]\nfleet = "sim"\n'
                f'[http]\nlisten = "127.0.0.1:{self.port}"\n[udp]\nenabled = false\n'
                f'[storage]\ndata_dir = "{dir}/data"\n'
                "[kmsg]\nenabled = false\n[host]\nenabled = false\n[tegrastats]\nenabled = false\n[jetson]\nenabled = false\n"
                "[nvml]\nenabled = false\n[rollup]\nenabled = false\n[health]\nenabled = false\n"
                f"{sink}"
            )
        self.log = open(os.path.join(dir, "agent.log"), "ab")
        self.proc = subprocess.Popen(
            [binary, "run", "--config", cfg], stdout=subprocess.DEVNULL, stderr=self.log,
            env=dict(os.environ, RUST_LOG="warn"))

    def ready(self):
        if self.proc.poll() is not None:
            raise SystemExit(f"agent {self.device_id} exited; see {self.dir}/agent.log")
        return http_get(f"http://127.0.0.1:{self.port}/health", timeout=2)[0] == 200

    def sink_status(self):
        code, body = http_get(f"http://127.0.0.1:{self.port}/api/v1/status")
        if code != 200:
            return None
        return json.loads(body)["forward"]["sinks"][0]


def default_bin():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    for p in ("release", "debug"):
        b = os.path.join(target, p, "edgewatch")
        if os.path.exists(b):
            return b
    return "edgewatch"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", "-n", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=3600, help="seconds of the reference device per agent")
    ap.add_argument("--inference-rate", type=int, default=30, help="inferences per second")
    ap.add_argument("--receiver", choices=["influxdb", "victoriametrics"], default="influxdb")
    ap.add_argument("--vm-sink", choices=["prometheus_remote_write", "influxdb"], default="prometheus_remote_write",
                    help="with --receiver victoriametrics: the agents' sink type")
    ap.add_argument("--bin", default=default_bin(), help="edgewatch binary (default: target/release, else target/debug)")
    ap.add_argument("--batch", type=int, default=5000, help="lines per request (backlog writes and the baseline)")
    ap.add_argument("--writers", type=int, default=4, help="agents written to at once")
    ap.add_argument("--backoff", default="1s,5s", help="sinks' min_backoff,max_backoff")
    ap.add_argument("--sink-timeout", default="10s", help="the sinks' request timeout (default: the sink's own default)")
    ap.add_argument("--baseline-agents", type=int, default=10, help="devices' worth of data in the single-connection baseline")
    ap.add_argument("--outage", type=float, default=10, help="seconds the receiver stays down after the backlog is written")
    ap.add_argument("--max-receiver-gb", type=float, default=6, help="stop when the receiver's RSS passes this (a shared machine)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the drain")
    ap.add_argument("--workdir", help="default: a temp dir, removed at the end")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()

    work = a.workdir or tempfile.mkdtemp(prefix="edgewatch-fleet-")
    os.makedirs(work, exist_ok=True)
    rcls = Influxd if a.receiver == "influxdb" else VictoriaMetrics
    VictoriaMetrics.sink_type = a.vm_sink
    agents, receivers = [], []
    report = {"agents": a.agents, "backlog_s": a.backlog, "inference_rate": a.inference_rate,
              "receiver": a.receiver, "binary": a.bin, "cpus": os.cpu_count()}
    try:
        start_ns = (time.time_ns() // 1_000_000_000 - a.backlog - 60) * 1_000_000_000
        t = time.monotonic()
        backlogs = [make_backlog(m, start_ns, a.backlog, a.inference_rate, a.batch) for m in MODULES]
        lines = [sum(v for k, v in c.items() if k != "_values") for _, c in backlogs]
        print(f"backlog: {a.backlog} s per device, {lines} lines per module kind, made in {time.monotonic() - t:.1f} s", flush=True)

        # 1. The receiver's own single-connection rate: the same data, tagged per device,
        # in --batch-line gzip requests from one client, to a receiver of its own.
        base = rcls(os.path.join(work, "baseline"), free_port())
        receivers.append(base)
        base.start()
        base.create("baseline")
        nb = min(a.baseline_agents, a.agents)
        bodies = []
        for i in range(nb):
            body_set, _ = backlogs[i % len(MODULES)]
            dev = f",device_id=dev-{i + 1:03d},fleet=sim"
            for b in body_set:
                bodies.append("\n".join(with_tags(l, dev) for l in b.decode().splitlines()).encode() + b"\n")
        base_points = sum(lines[i % len(MODULES)] for i in range(nb))
        secs = post_all(base.live_port, base.ingest_path("baseline"), bodies, gzipped=True)
        report["baseline_points"] = base_points
        report["baseline_pps"] = round(base_points / secs)
        print(f"baseline: one connection, {base_points} points in {secs:.1f} s = {base_points / secs:,.0f} points/s", flush=True)
        base.stop()
        shutil.rmtree(base.dir, ignore_errors=True)
        receivers.remove(base)

        # 2. The fleet, its receiver down.
        recv = rcls(os.path.join(work, "receiver"), free_port())
        receivers.append(recv)
        recv.prepare()
        backoff = a.backoff.split(",") + [a.sink_timeout]
        t = time.monotonic()
        for i in range(a.agents):
            agents.append(Agent(a.bin, os.path.join(work, f"dev-{i + 1:03d}"), f"dev-{i + 1:03d}", recv.sink("fleet", backoff)))
        for ag in agents:
            if not wait_until(60, ag.ready):
                raise SystemExit(f"agent {ag.device_id} not ready; see {ag.dir}/agent.log")
        print(f"{a.agents} agents up in {time.monotonic() - t:.1f} s", flush=True)

        t = time.monotonic()
        cpu0 = sum(proc_cpu_s(ag.proc.pid) for ag in agents)

        def write(i):
            return post_all(agents[i].port, "/write?db=x", backlogs[i % len(MODULES)][0])

        with concurrent.futures.ThreadPoolExecutor(a.writers) as ex:
            list(ex.map(write, range(a.agents)))
        written = {ag.device_id: lines[i % len(MODULES)] for i, ag in enumerate(agents)}
        want_received = sum(backlogs[i % len(MODULES)][1][recv.unit] if recv.unit != "points" else lines[i % len(MODULES)] for i in range(a.agents))
        total = sum(written.values())
        wsecs = time.monotonic() - t
        report["fleet_points"] = total
        report["write_s"] = round(wsecs, 1)
        report["write_agent_cpu_s"] = round(sum(proc_cpu_s(ag.proc.pid) for ag in agents) - cpu0, 1)
        print(f"backlog written: {total:,} points into {a.agents} agents in {wsecs:.1f} s", flush=True)
        for ag in agents:
            st = wait_until(30, lambda: (lambda s: s if s and s["backlog_points"] == written[ag.device_id] else None)(ag.sink_status()), 0.2)
            if not st:
                raise SystemExit(f"{ag.device_id}: backlog is {ag.sink_status()}, wrote {written[ag.device_id]}")

        # The outage goes on for a while: every sink has tried, failed and backed off.
        time.sleep(a.outage)
        before = {ag.device_id: ag.sink_status() or {} for ag in agents}
        report["sink_errors_during_outage"] = sum(s.get("errors", 0) for s in before.values())

        # 3. The receiver comes up; every agent drains at once.
        pids = [ag.proc.pid for ag in agents]
        for p in pids:
            reset_peak_rss(p)
        cpu0 = sum(proc_cpu_s(p) for p in pids)
        sampler = Sampler(recv.port, pids)
        sampler.start()
        t0 = time.monotonic()
        recv.start()
        up_s = time.monotonic() - t0
        drained_at, last, overload_seen = {}, {}, {}
        next_note = time.monotonic() + 10
        while len(drained_at) < len(agents) and time.monotonic() - t0 < a.timeout:
            rss = proc_kb(recv.proc.pid, "VmRSS") / 1048576
            report["receiver_peak_rss_gb"] = max(report.get("receiver_peak_rss_gb", 0), round(rss, 2))
            if rss > a.max_receiver_gb:
                print(json.dumps(report, indent=1))
                raise SystemExit(f"the receiver's RSS reached {rss:.1f} GB (> --max-receiver-gb): stopped "
                                 f"after {time.monotonic() - t0:.0f} s with {sum(s['forwarded_points'] for s in last.values()):,} "
                                 f"of {total:,} points acknowledged; {len(drained_at)} agents drained")
            if time.monotonic() > next_note:
                next_note += 10
                print(f"  {time.monotonic() - t0:5.0f} s: {sum(s['forwarded_points'] for s in last.values()):,} of {total:,} "
                      f"acknowledged, {len(drained_at)} agents drained, receiver {rss:.1f} GB, "
                      f"{sampler.peak_conns} connections at most", flush=True)
            for ag in agents:
                if ag.device_id in drained_at:
                    continue
                st = ag.sink_status()
                if st is None:
                    continue
                last[ag.device_id] = st
                # A 429/503 answer shows as the sink's last error until its next success:
                # each distinct one seen is counted (a lower bound between two polls).
                err = st.get("last_error") or ""
                if ("HTTP 429" in err or "HTTP 503" in err) and st.get("last_error_ns") not in overload_seen.setdefault(ag.device_id, set()):
                    overload_seen[ag.device_id].add(st.get("last_error_ns"))
                if st["backlog_points"] == 0 and st["forwarded_points"] >= written[ag.device_id]:
                    drained_at[ag.device_id] = time.monotonic() - t0
            time.sleep(0.5)
        drain_s = max(drained_at.values(), default=float("nan"))
        sampler.stop.set()
        sampler.join()
        if len(drained_at) < len(agents):
            raise SystemExit(f"only {len(drained_at)} of {len(agents)} agents drained within {a.timeout} s")
        cpu = sum(proc_cpu_s(p) for p in pids) - cpu0
        hwm = sum(proc_kb(p, "VmHWM") for p in pids)
        times = sorted(drained_at.values())
        report.update({
            "receiver_start_s": round(up_s, 1),
            "drain_s": round(drain_s, 1),
            "first_device_drained_s": round(times[0], 1),
            "median_device_drained_s": round(times[len(times) // 2], 1),
            "fleet_pps": round(total / drain_s),
            "fleet_vs_single_connection": round(total / drain_s / report["baseline_pps"], 2),
            "peak_receiver_connections": sampler.peak_conns,
            "sink_errors_during_drain": sum(s["errors"] for s in last.values()) - report["sink_errors_during_outage"],
            "answers_429_or_503_seen": sum(len(v) for v in overload_seen.values()),
            "agents_answered_429_or_503": sum(1 for v in overload_seen.values() if v),
            # Batches resent after a fault during the drain (those that failed against the
            # closed port during the outage are counted as replayed too, and delivered nothing).
            "replayed_batches_during_drain": sum(s["replayed_batches"] - before[d].get("replayed_batches", 0) for d, s in last.items()),
            "dead_letter_points": sum(s["dead_letter_points"] for s in last.values()),
            "agents_cpu_s": round(cpu, 1),
            "agents_cpu_us_per_point": round(cpu * 1e6 / total, 2),
            "agents_peak_rss_mb_sum": round(hwm / 1024, 1),
            "agents_peak_rss_mb_sampled_sum": round(sampler.peak_rss_kb / 1024, 1),
            "agent_peak_rss_mb_mean": round(hwm / 1024 / len(pids), 1),
        })

        # 4. Exactly once: the receiver's count per device and measurement equals what was
        # written; each agent acknowledged every point once and resent none.
        got = recv.counts(sorted(COUNT_FIELD), a.backlog)
        bad = []
        for i, ag in enumerate(agents):
            want = backlogs[i % len(MODULES)][1]
            want = {k: v for k, v in want.items() if k != "_values"}
            have = got.get(ag.device_id, {})
            if have != want:
                bad.append(f"{ag.device_id}: receiver has {have}, written {want}")
            st = last[ag.device_id]
            if st["forwarded_points"] != written[ag.device_id] or st["dead_letter_points"] != 0:
                bad.append(f"{ag.device_id}: forwarded {st['forwarded_points']} of {written[ag.device_id]}, dead letters {st['dead_letter_points']}")
        received = recv.received()
        report["receiver_accepted"] = received
        report["stored_exactly_once"] = not bad
        report["resent_" + recv.unit.strip("_")] = received - want_received
        report["sent_once"] = received == want_received
        if received < want_received:
            bad.append(f"the receiver accepted {received} {recv.unit.strip('_')}, written {want_received}: some never arrived")
        elif received > want_received:
            # Stored once all the same (a resent point overwrites itself), but the traffic
            # was larger: batches whose answer came after the sink's timeout went again.
            print(f"WARNING: the receiver accepted {received:,} {recv.unit.strip('_')} for {want_received:,} written: "
                  f"{received - want_received:,} were sent again (answers slower than the sinks' timeout)", file=sys.stderr)
        extra = sorted(set(got) - set(written))
        if extra:
            bad.append(f"devices nobody wrote: {extra}")
        print(json.dumps(report, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)
        if bad:
            print("MISMATCH:\n  " + "\n  ".join(bad[:20]), file=sys.stderr)
            return 1
        resent = report["resent_" + recv.unit.strip("_")]
        print(f"OK: {a.agents} devices x {lines} points stored exactly once "
              f"({'none sent twice' if not resent else f'{resent:,} {recv.unit.strip(chr(95))} sent twice'}); fleet drained {total:,} points in {drain_s:.1f} s "
              f"({total / drain_s:,.0f} points/s, x{report['fleet_vs_single_connection']} the receiver's single-connection rate)")
        return 0
    finally:
        for ag in agents:  # all at once: SIGTERM, then a shared deadline
            if ag.proc.poll() is None:
                ag.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 30
        for ag in agents:
            try:
                ag.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                ag.proc.kill()
                ag.proc.wait()
        for r in receivers:
            r.stop()
        if not a.keep and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
        elif a.keep:
            print(f"kept {work}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
