#!/usr/bin/env python3
"""The whole agent within a device budget: the release agent with everything on, measured.

One agent runs the reference device workload with every part on at once:
  - tegrastats replayed at 1 Hz (the fixture lines of crates/tegrastats-parser) and the
    [jetson] collector on a fixture tree (tests/data/jetson/agx-orin-jp5), host collector
    every 10 s, [health] every 10 s, the kernel log collector ([kmsg], as root);
  - the Python client (clients/python, the real package): 30 inferences/s over UDP and 5/s
    over HTTP with a token, two stages and wall/GPU time like a camera pipeline;
  - 100 alert rules (over the 35 models' `inference` series) plus the built-ins;
  - an InfluxDB 1.x sink and an MQTT sink forwarding live to real peers (Debian's
    `influxdb`, `mosquitto`);
  - two scrape targets: a real `prometheus-node-exporter` and a Triton-format page;
  - rollups at their defaults; one watched process (the load generator);
then the same with the UI open (Debian's headless `chromium` on the overview, which polls),
then an idle agent (no client load, no sinks, no scrapes, no rules), then the full workload
with one part off at a time, so each part's share is the difference.

For each phase: CPU share of one core (user + system from /proc/PID/stat), steady RSS
(median of the second half of the samples) and peak RSS (VmHWM since the phase started),
wakeups per second (voluntary context switches summed over the agent's threads), bytes
written to disk per hour (/proc/PID/io write_bytes) against the bytes the store grew by
(pages in use, WAL included: see `store_bytes`),
and fsync/fdatasync calls per second (counted by `strace -c` attached for the last
`--strace` seconds of the full phase only: strace slows the agent, so no other figure is
taken while it is attached).

    python3 scripts/device_budget.py                       # 10 min per phase
    python3 scripts/device_budget.py --seconds 120         # quick
    python3 scripts/device_budget.py --phases full,ui,idle # only these
    python3 scripts/device_budget.py --phases full --wal-trace  # + WAL pages by commit kind
    python3 scripts/device_budget.py --phases full --device     # + what the block device writes (root)
    python3 scripts/device_budget.py --phases full --prometheus 15  # + a real Prometheus scraping /metrics
    python3 scripts/device_budget.py --phases full --keep K         # keep each phase's store in K/PHASE
    python3 scripts/device_budget.py --phases full --seed K/full --seconds 3900 --warmup 240
        # start on a copy of that store: an older store's hour (its small-chunk merges)
        # without an hour of warm-up

Targets (issue 33): full < 1 % of one core and < 25 MB steady RSS; idle < 0.2 %; bytes
written per hour at most 3x the store's growth. Standard library only; every peer on
127.0.0.1, stopped by PID. Exit status 0 when the targets are met.
"""

import argparse
import collections
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))

import fleet  # noqa: E402  (free_port, wait_until, http_get, Influxd)

TOKEN = "budget-token"
# The kernel's page: what `write_bytes` counts for each page a write dirties.
PAGE = os.sysconf("SC_PAGE_SIZE")
MODELS_UDP = [f"cam{i:02d}" for i in range(30)]
MODELS_HTTP = [f"det{i}" for i in range(5)]
PARTS = ["jetson", "host", "client", "sinks", "scrapes", "alerts", "rollup", "kmsg", "health"]


def points_written(base):
    """The agent's points stored since it started (`ingest.points_written` of the status)."""
    try:
        return json.loads(fleet.http_get(base + "/api/v1/status")[1] or "{}").get("ingest", {}).get("points_written")
    except OSError:
        return None


def need(cmd, package):
    if shutil.which(cmd) is None:
        raise SystemExit(f"{cmd} not found: apt-get install {package}")


class Proc:
    """A child process stopped by PID."""

    live = []  # every Proc started, so an interrupted phase can stop its own

    def __init__(self, args, log, **kw):
        self.log = open(log, "ab")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=self.log, **kw)
        Proc.live.append(self)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


class TritonPage:
    """A Triton-format /metrics page whose counters grow like a served model's."""

    def __init__(self):
        self.t0 = time.monotonic()
        page = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = page.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def text(self):
        n = int((time.monotonic() - self.t0) * 30)
        out = []
        for fam, kind, per in [
            ("nv_inference_request_success", "counter", 1),
            ("nv_inference_count", "counter", 1),
            ("nv_inference_exec_count", "counter", 1),
            ("nv_inference_request_duration_us", "counter", 9500),
            ("nv_inference_queue_duration_us", "counter", 800),
            ("nv_inference_compute_infer_duration_us", "counter", 7000),
        ]:
            out.append(f"# HELP {fam} {fam}\n# TYPE {fam} {kind}")
            for m in ("yolov8n", "resnet50"):
                out.append(f'{fam}{{model="{m}",version="1"}} {n * per}')
        out.append("# HELP nv_gpu_utilization GPU utilization\n# TYPE nv_gpu_utilization gauge")
        out.append('nv_gpu_utilization{gpu_uuid="GPU-0"} 0.41')
        return "\n".join(out) + "\n"

    def stop(self):
        self.server.shutdown()


def rules():
    """100 rules over the `inference` series: a quarter each p99, p99/p50, mean, max."""
    out = []
    models = MODELS_UDP + MODELS_HTTP
    for i in range(100):
        m = models[i % len(models)]
        kind = i % 4
        agg, extra, window = [
            ("p99", "", "5m"),
            ("p99", 'ratio_of = "p50"\n', "5m"),
            ("mean", "", "15m"),
            ("max", "", "1h"),
        ][kind]
        thr = [40.0, 3.0, 30.0, 80.0][kind]
        out.append(
            f'[[alert]]\nname = "Budget{i:03d}"\nmeasurement = "inference"\nfield = "wall_ms"\n'
            f'tags = {{ model = "{m}" }}\ngroup_by = ["model"]\nagg = "{agg}"\n{extra}'
            f'window = "{window}"\nop = ">"\nthreshold = {thr}\nfor = "1m"\n'
        )
    return "".join(out)


def config(work, ports, off, peers):
    """The agent's config with every part on except those in `off`."""
    c = [
        f'device_id = "budget-1"\n[http]\nlisten = "127.0.0.1:{ports["http"]}"\ntoken = "{TOKEN}"\n',
        f'[udp]\nlisten = "127.0.0.1:{ports["udp"]}"\n',
        f'[storage]\ndata_dir = "{work}/data"\n',
        "[log]\nlevel = \"warn\"\n",
    ]
    if "jetson" in off:
        c.append("[tegrastats]\nenabled = false\n[jetson]\nenabled = false\n")
    else:
        c.append(f'[tegrastats]\nreplay = "{work}/tegrastats.log"\ninterval = "1s"\n')
        c.append(f'[jetson]\nroot = "{work}/jetson"\n')
    if "host" in off:
        c.append("[host]\nenabled = false\n")
    if "rollup" in off:
        c.append("[rollup]\nenabled = false\n")
    if "kmsg" in off:
        c.append("[kmsg]\nenabled = false\n")
    if "health" in off:
        c.append("[health]\nenabled = false\n")
    c.append("[nvml]\nenabled = false\n")
    if "alerts" in off:
        c.append("[alerts]\nbuiltin = false\n")
    else:
        c.append(rules())
    if "client" not in off:
        c.append('[[process]]\nname = "python3"\nlabel = "loadgen"\n')
    if "sinks" not in off:
        c.append(
            f'[[sink]]\ntype = "influxdb"\nname = "influx"\nurl = "http://127.0.0.1:{peers["influx"]}"\n'
            'version = 1\ndatabase = "edge"\n'
        )
        c.append(
            f'[[sink]]\ntype = "mqtt"\nname = "broker"\nurl = "mqtt://127.0.0.1:{peers["mqtt"]}"\n'
            'topic = "edgewatch/{device_id}"\n'
        )
    if "scrapes" not in off:
        c.append(
            f'[[scrape]]\nname = "node"\nurl = "http://127.0.0.1:{peers["node"]}/metrics"\n'
            'interval = "15s"\ninclude = ["node_cpu_seconds_total", "node_memory_*", "node_disk_*", "node_network_*"]\n'
        )
        c.append(
            f'[[scrape]]\nname = "triton"\nurl = "http://127.0.0.1:{peers["triton"]}/metrics"\ninterval = "10s"\n'
        )
    return "".join(c)


LOADGEN = r"""
import random, sys, time
import edgewatch
udp_port, http_port, token, secs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
udp = edgewatch.Recorder(f"udp://127.0.0.1:{udp_port}", app="camera")
web = edgewatch.Recorder(f"http://127.0.0.1:{http_port}", token=token, app="detector")
cams = [f"cam{i:02d}" for i in range(30)]
dets = [f"det{i}" for i in range(5)]
start = time.monotonic()
k = 0
while time.monotonic() - start < secs:
    due = start + k / 30.0
    d = due - time.monotonic()
    if d > 0:
        time.sleep(d)
    with udp.infer(cams[k % 30], batch_size=1) as t:
        with t.stage("preprocess"):
            pass
        with t.stage("infer"):
            pass
    if k % 6 == 0:
        with web.infer(dets[(k // 6) % 5]) as t:
            with t.stage("infer"):
                pass
    k += 1
udp.close()
web.close()
"""


def proc_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read().rsplit(")", 1)[1].split()
    return int(s[11]) + int(s[12])


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def voluntary_switches(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        n += int(line.split()[1])
        except OSError:
            pass
    return n


def write_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def wal_frames(data):
    """(page number, commit flag) of each frame of the WAL's current generation, and the
    owner of each page (see `page_owners`)."""
    frames = []
    wal_path = os.path.join(data, "edgewatch.db-wal")
    wal = open(wal_path, "rb").read() if os.path.exists(wal_path) else b""
    if len(wal) >= 32:
        page_size, salt = struct.unpack(">I", wal[8:12])[0], wal[16:24]
        off = 32
        while off + 24 + page_size <= len(wal) and wal[off + 8:off + 16] == salt:
            pgno, commit = struct.unpack(">II", wal[off:off + 8])
            frames.append((pgno, commit != 0))
            off += 24 + page_size
    return frames, page_owners(data)


class DirtyTracer:
    """Attributes what `write_bytes` counts to files and threads: the kernel's
    `writeback:writeback_dirty_folio` event fires each time a task dirties a clean page of the
    page cache (the moment `/proc/PID/io` counts it), with the file's inode and the page's
    index. A tracefs instance of its own follows the agent's threads (and any it starts:
    `event-fork`), so other tracing and other runs are not disturbed. Direct-IO writes (the
    ingest journal's synced appends) dirty no page and do not show here: the agent's status
    counts them. Needs root and tracefs."""

    ROOT = "/sys/kernel/tracing"
    LINE = re.compile(r"^\s*(.*?)-(\d+)\s+\[\d+\].*?writeback_dirty_folio: bdi \S+: ino=(\d+) index=(\d+)")

    def __init__(self, pid):
        if not os.path.isdir(os.path.join(self.ROOT, "instances")):
            raise SystemExit("--dirty-trace needs tracefs at /sys/kernel/tracing (and root)")
        self.pid = pid
        self.dir = os.path.join(self.ROOT, "instances", f"edgewatch-budget-{os.getpid()}-{pid}")
        os.mkdir(self.dir)
        self.pages = collections.Counter()  # (thread name, inode) -> pages dirtied
        self.indexes = collections.defaultdict(set)  # inode -> distinct page indexes
        self.lost = 0
        self._write("buffer_size_kb", "4096")
        self._write("options/event-fork", "1")
        self._write("set_event_pid", " ".join(os.listdir(f"/proc/{pid}/task")))
        self._write("events/writeback/writeback_dirty_folio/enable", "1")
        # Non-blocking, so that `finish` can stop the reader between reads.
        self.fd = os.open(os.path.join(self.dir, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def _write(self, name, value):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(value)

    def loop(self):
        rest = b""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                chunk = b""
            if not chunk:
                if self.stop_flag.is_set():
                    return
                time.sleep(0.2)
                continue
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                self.take(line.decode(errors="replace"))

    def take(self, line):
        m = self.LINE.match(line)
        if not m:
            if "LOST" in line:
                self.lost += 1
            return
        comm, ino, index = m.group(1).strip(), int(m.group(3)), int(m.group(4))
        self.pages[(comm, ino)] += 1
        self.indexes[ino].add(index)

    def finish(self, files, hours):
        """Stops tracing and returns MB/h dirtied by file and thread; `files` maps a name to
        its path, for the inodes (a file replaced in the window keeps its last inode)."""
        self._write("events/writeback/writeback_dirty_folio/enable", "0")
        time.sleep(0.5)
        self._write("tracing_on", "0")
        # The reader drains what is buffered, then sees the flag and ends.
        self.stop_flag.set()
        self.thread.join(10)
        os.close(self.fd)
        try:
            os.rmdir(self.dir)
        except OSError:
            pass
        names = {}
        # The agent's open files first (a deleted temp file is named by its link), then the
        # store's by name.
        for fd in os.listdir(f"/proc/{self.pid}/fd") if os.path.isdir(f"/proc/{self.pid}/fd") else []:
            link = os.path.join(f"/proc/{self.pid}/fd", fd)
            try:
                names[os.stat(link).st_ino] = os.readlink(link)
            except OSError:
                pass
        for name, path in files.items():
            try:
                names[os.stat(path).st_ino] = name
            except OSError:
                pass
        by_file = collections.Counter()
        by_thread = collections.Counter()
        for (comm, ino), n in self.pages.items():
            f = names.get(ino, "no file of the agent's (file-system metadata)")
            by_file[f] += n
            by_thread[(f, re.sub(r"[-_]?\d+$", "", comm))] += n
        mb = lambda n: round(n * PAGE / 1e6 / hours, 2)
        return {
            "by_file": {f: mb(n) for f, n in by_file.most_common()},
            "distinct_pages": {names.get(i, f"ino {i}"): len(s) for i, s in self.indexes.items() if i in names},
            "by_file_and_thread": {f"{f} / {t}": mb(n) for (f, t), n in by_thread.most_common(24)},
            "other_inodes": {i: len(s) for i, s in self.indexes.items() if i not in names},
            "lost_events": self.lost,
        }


class WalTracer:
    """Follows the WAL through the measured window (polling every second) and keeps each
    commit's page numbers: which kinds of commit write how many pages an hour, across
    checkpoints (a new generation has new salts and starts again at the first frame)."""

    def __init__(self, data):
        self.path = os.path.join(data, "edgewatch.db-wal")
        self.salt, self.off, self.pending = None, 32, []
        self.commits = []
        self.generations = 0
        self.page_size = 4096
        # Frames already in the WAL (the start-up and the warm-up, when no checkpoint has
        # run since) are outside the measured window: read past them, count from here.
        self.poll()
        self.commits = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                head = f.read(32)
                if len(head) < 32:
                    return
                page_size, salt = struct.unpack(">I", head[8:12])[0], head[16:24]
                self.page_size = page_size
                if salt != self.salt:
                    self.salt, self.off, self.pending = salt, 32, []
                    self.generations += 1
                while True:
                    f.seek(self.off)
                    fh = f.read(24)
                    if len(fh) < 24 or fh[8:16] != salt:
                        return
                    pgno, commit = struct.unpack(">II", fh[:8])
                    self.pending.append(pgno)
                    self.off += 24 + page_size
                    if commit:
                        self.commits.append((self.generations, self.pending))
                        self.pending = []
        except OSError:
            return

    def loop(self):
        while not self.stop_flag.wait(1.0):
            self.poll()

    def finish(self, data, hours):
        """Commits grouped by the tables they wrote (page 1, pointer maps, the free list and
        `sqlite_sequence` left out of the key): commits and pages an hour for each kind."""
        self.stop_flag.set()
        self.thread.join()
        self.poll()
        owner = page_owners(data)
        hot = "page 1 / pointer map / free list"

        def table(p):
            return owner.get(p, hot).split(" (")[0]

        kinds = {}
        for _, pages in self.commits:
            tables = sorted({table(p) for p in pages} - {hot, "sqlite_sequence", "sqlite_schema"})
            k = "+".join(tables) or "(page 1 / pointer maps only)"
            e = kinds.setdefault(k, {"commits_per_h": 0.0, "pages_per_h": 0.0})
            e["commits_per_h"] += 1 / hours
            e["pages_per_h"] += len(pages) / hours
        # What checkpoints copy: each generation's distinct pages, by table (the last
        # generation's copy may still be to come).
        distinct = {}
        for gen, pages in self.commits:
            distinct.setdefault(gen, set()).update(pages)
        copies, frames = {}, {}
        for pages in distinct.values():
            for p in pages:
                copies[table(p)] = copies.get(table(p), 0) + 1
        for _, pages in self.commits:
            for p in pages:
                frames[table(p)] = frames.get(table(p), 0) + 1
        pages = sum(len(p) for _, p in self.commits)

        def per_h(d):
            return {k: round(v * self.page_size / 1e6 / hours, 2) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:14]}

        return {
            "commits_per_h": round(len(self.commits) / hours),
            "pages_per_h": round(pages / hours),
            "wal_mb_per_h": round(pages * self.page_size / 1e6 / hours, 1),
            "page_size": self.page_size,
            "generations": self.generations,
            "by_kind": {k: {"commits_per_h": round(v["commits_per_h"]), "pages_per_h": round(v["pages_per_h"])}
                        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["pages_per_h"])[:14]},
            "wal_mb_per_h_by_table": per_h(frames),
            "checkpoint_mb_per_h_by_table": per_h(copies),
            "store_mb_by_table": table_sizes(data),
        }


def on_a_copy(data, sql):
    """The rows of `sql` over a copy of the store (database and WAL), so that reading
    dbstat never holds up the agent."""
    copy = tempfile.mkdtemp(prefix="wear-dbstat-")
    try:
        for f in os.listdir(data):
            if f.startswith("edgewatch.db"):
                shutil.copy(os.path.join(data, f), copy)
        conn = sqlite3.connect(f"file:{copy}/edgewatch.db?mode=ro", uri=True)
        rows = conn.execute(sql).fetchall()
        conn.close()
        return rows
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def table_sizes(data):
    """MB each table and index holds at the end."""
    rows = on_a_copy(data, "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC LIMIT 12")
    return {n: round(b / 1e6, 2) for n, b in rows}


def page_owners(data):
    """Page number -> "table (page type)"."""
    return {p: f"{n} ({t})" for n, p, t in on_a_copy(data, "SELECT name, pageno, pagetype FROM dbstat")}


def dir_bytes(path):
    n = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                n += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return n


def store_bytes(data):
    """The store's logical size: pages in use ((page_count - freelist_count) * page_size)
    as a reader sees it, WAL included. The files' size is no measure of growth over minutes:
    the WAL grows and is truncated in steps of megabytes, and freed pages are reused."""
    import sqlite3

    db = os.path.join(data, "edgewatch.db")
    if not os.path.exists(db):
        return 0
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        free = c.execute("PRAGMA freelist_count").fetchone()[0]
        size = c.execute("PRAGMA page_size").fetchone()[0]
        return (pages - free) * size
    finally:
        c.close()


def reset_peak(pid):
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def thread_names(pid):
    names = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                names[int(t)] = f.read().strip()
        except OSError:
            pass
    return names


IO_LINE = re.compile(r"^(\d+)\s+(pwrite64|write|pwritev|writev|fsync|fdatasync)\((\d+)<([^>]*)>.*\)\s+=\s+(-?\d+)")


def io_breakdown(pid, data, work, name, secs):
    """Bytes written and syncs per (thread, file) in the data dir, from `strace -f -y`
    attached for `secs`: which part of the agent writes what (the write-wear breakdown)."""
    need("strace", "strace")
    out = os.path.join(work, f"strace-io-{name}.txt")
    names = thread_names(pid)
    st = subprocess.Popen(
        ["strace", "-f", "-y", "-s", "0", "-e", "trace=pwrite64,write,pwritev,writev,fsync,fdatasync",
         "-o", out, "-p", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    time.sleep(secs)
    names.update(thread_names(pid))
    st.send_signal(signal.SIGINT)
    st.wait(30)
    acc = {}
    with open(out) as f:
        for line in f:
            m = IO_LINE.match(line)
            if not m or not m.group(4).startswith(data):
                continue
            tid, call, path, ret = int(m.group(1)), m.group(2), m.group(4), int(m.group(5))
            thread = re.sub(r"\d+$", "", names.get(tid, "?"))
            key = f"{thread} {os.path.basename(path)}"
            e = acc.setdefault(key, {"mb_per_h": 0.0, "calls_per_s": 0.0, "syncs": 0})
            if call in ("fsync", "fdatasync"):
                e["syncs"] += 1
            elif ret > 0:
                e["mb_per_h"] += ret / 1e6 * 3600 / secs
                e["calls_per_s"] += 1 / secs
    return {k: {"mb_per_h": round(v["mb_per_h"], 1), "calls_per_s": round(v["calls_per_s"], 2),
                "syncs": v["syncs"], "syncs_per_s": round(v["syncs"] / secs, 2)}
            for k, v in sorted(acc.items(), key=lambda kv: -kv[1]["mb_per_h"])}


class LoopFs:
    """`--device`: the phase's data directory on an ext4 file system of its own, on a loop
    device, so the sectors the block device is asked to write (`/sys/block/loopN/stat`)
    can be read: what a card would see, the file system's journal and metadata included,
    which `write_bytes` (page-cache bytes the agent dirtied) does not count."""

    def __init__(self, work, name, mountpoint, options="", size_mb=2048):
        for cmd, pkg in [("losetup", "mount"), ("mkfs.ext4", "e2fsprogs")]:
            need(cmd, pkg)
        self.img = os.path.join(work, f"fs-{name}.img")
        self.mountpoint = mountpoint
        with open(self.img, "wb") as f:
            f.truncate(size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", self.img], check=True)
        self.dev = subprocess.run(["losetup", "-f", "--show", self.img], check=True,
                                  capture_output=True, text=True).stdout.strip()
        os.makedirs(mountpoint, exist_ok=True)
        try:
            subprocess.run(["mount"] + (["-o", options] if options else []) + [self.dev, mountpoint], check=True)
        except subprocess.CalledProcessError:
            subprocess.run(["losetup", "-d", self.dev])
            raise

    def sectors_written(self):
        """512-byte sectors written to the device so far, after writing back what is dirty."""
        subprocess.run(["sync", "-f", self.mountpoint], check=True)
        with open(f"/sys/block/{os.path.basename(self.dev)}/stat") as f:
            return int(f.read().split()[6])

    def close(self):
        subprocess.run(["umount", self.mountpoint])
        subprocess.run(["losetup", "-d", self.dev])
        try:
            os.unlink(self.img)
        except OSError:
            pass


def run_phase(name, args, work, ports, peers, off, ui, secs, strace_s):
    """Starts a fresh agent (own data dir), warms it up, measures `secs`, stops it."""
    data = os.path.join(work, "data")
    shutil.rmtree(data, ignore_errors=True)
    loopfs = LoopFs(work, name, data, args.mount_options) if args.device else None
    if args.seed:
        # An old store to start from: a consistent copy (SQLite's backup), so the measured
        # hour sees what a device that has run for a while does (merges of an hour's small
        # chunks come once the 1h tier folds, an hour after the agent starts).
        os.makedirs(data, exist_ok=True)
        src = sqlite3.connect(f"file:{os.path.join(args.seed, 'edgewatch.db')}?mode=ro", uri=True)
        dst = sqlite3.connect(os.path.join(data, "edgewatch.db"))
        src.backup(dst)
        dst.close()
        src.close()
    started = len(Proc.live)
    try:
        return measure_phase(name, args, work, ports, peers, off, ui, secs, strace_s, data, loopfs)
    finally:
        # The agent and the phase's load, stopped already unless the phase was interrupted
        # (their files on a `--device` file system keep it from unmounting).
        for p in Proc.live[started:]:
            p.stop()
        del Proc.live[started:]
        if loopfs:
            loopfs.close()


def measure_phase(name, args, work, ports, peers, off, ui, secs, strace_s, data, loopfs):
    cfg = os.path.join(work, "edgewatch.toml")
    with open(cfg, "w") as f:
        f.write(config(work, ports, off, peers))
    subprocess.run([args.bin, "check-config", cfg], check=True, stdout=subprocess.DEVNULL)
    agent = Proc([args.bin, "run", "--config", cfg], os.path.join(work, f"agent-{name}.log"))
    base = f"http://127.0.0.1:{ports['http']}"
    if not fleet.wait_until(30, lambda: fleet.http_get(base + "/health")[0] == 200):
        agent.stop()
        raise SystemExit(f"agent did not start; see {work}/agent-{name}.log")
    pid = agent.p.pid
    extra = []
    if "client" not in off:
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python", "src"))
        extra.append(
            Proc(
                ["python3", "-c", LOADGEN, str(ports["udp"]), str(ports["http"]), TOKEN, str(args.warmup + secs + 60)],
                os.path.join(work, "loadgen.log"),
                env=env,
            )
        )
    poller = None
    if args.poll:
        # An app or dashboard that polls the API without `X-Edgewatch-Read: stored` (a read
        # of the latest, the default): the engine's latency query and the newest raw points.
        stop_poll = threading.Event()

        def poll():
            qs = [
                "/api/v1/query?measurement=inference&field=wall_ms&from=-15m&step=10s&agg=p99",
                "/api/v1/query?measurement=inference&field=wall_ms&from=-10s",
            ]
            while not stop_poll.wait(args.poll):
                for q in qs:
                    fleet.http_get(base + q)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
    prom_port = None
    if args.prometheus:
        # A real Prometheus scraping the agent's /metrics, as a device that a local or
        # central Prometheus scrapes is (its own TSDB is another process' writes).
        need("prometheus", "prometheus")
        prom_port = fleet.free_port()
        prom_cfg = os.path.join(work, f"prometheus-{name}.yml")
        with open(prom_cfg, "w") as f:
            f.write(
                f"global:\n  scrape_interval: {args.prometheus}s\n"
                f"scrape_configs:\n  - job_name: edgewatch\n"
                f"    static_configs:\n      - targets: ['127.0.0.1:{ports['http']}']\n"
            )
        extra.append(
            Proc(
                ["prometheus", f"--config.file={prom_cfg}", f"--storage.tsdb.path={work}/prom-{name}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                os.path.join(work, f"prometheus-{name}.log"),
            )
        )
    if ui:
        need("chromium", "chromium")
        prof = tempfile.mkdtemp(prefix="budget-chromium-")
        # On loopback the token guards writes only: the page reads the API like a local tab.
        extra.append(
            Proc(
                ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={prof}",
                 "--remote-debugging-port=0", f"http://127.0.0.1:{ports['http']}/"],
                os.path.join(work, "chromium.log"),
            )
        )
    if args.checkpoint_at is not None and args.checkpoint_at < args.warmup:
        # A complete checkpoint in the warm-up, as the agent's own at 16 MiB of WAL does, so
        # that a window measured after it falls in the WAL's reuse in place (steady state)
        # without waiting for the agent's first one (~45 min with everything on).
        time.sleep(args.checkpoint_at)
        checkpoint(data, f"at {args.checkpoint_at} s")
        time.sleep(args.warmup - args.checkpoint_at)
    else:
        time.sleep(args.warmup)
    if args.checkpoint_window:
        # The window starts on a WAL with nothing left to copy, so the checkpoint at its end
        # copies exactly what the window wrote to the WAL.
        checkpoint(data, "at the window's start")
    reset_peak(pid)
    t0 = time.monotonic()
    c0, v0, w0, d0 = proc_ticks(pid), voluntary_switches(pid), write_bytes(pid), store_bytes(data)
    f0 = dir_bytes(data)
    s0 = loopfs.sectors_written() if loopfs else None
    j0, k0 = journal_appends(base), wal_restarts(data)
    p0 = points_written(base)
    tracer = WalTracer(data) if args.wal_trace else None
    dirty = DirtyTracer(pid) if args.dirty_trace else None
    rss = []
    end = t0 + secs
    while time.monotonic() < end - (strace_s if strace_s else 0):
        time.sleep(min(5.0, max(0.0, end - time.monotonic())))
        rss.append(status_kb(pid, "VmRSS"))
    elapsed = time.monotonic() - t0
    # The checkpoint's copy of the window's WAL, written by this process (counted from its
    # own write_bytes) before the agent's figures are read, so both end together.
    ckpt_bytes = checkpoint(data, "at the window's end") if args.checkpoint_window else None
    c1, v1, w1, d1 = proc_ticks(pid), voluntary_switches(pid), write_bytes(pid), store_bytes(data)
    f1 = dir_bytes(data)
    s1 = loopfs.sectors_written() if loopfs else None
    j1, k1 = journal_appends(base), wal_restarts(data)
    hwm = status_kb(pid, "VmHWM")
    wal_trace = tracer.finish(data, elapsed / 3600) if tracer else None
    dirty_trace = None
    if dirty:
        files = {
            os.path.relpath(os.path.join(d, n), data): os.path.join(d, n)
            for d, _, names in os.walk(data) for n in names
        }
        files[f"agent-{name}.log"] = os.path.join(work, f"agent-{name}.log")
        dirty_trace = dirty.finish(files, elapsed / 3600)
    fsyncs = None
    io = None
    if strace_s and args.io_trace:
        io = io_breakdown(pid, data, work, name, strace_s)
        fsyncs = sum(v["syncs"] for v in io.values()) / strace_s
    elif strace_s:
        need("strace", "strace")
        out = os.path.join(work, f"strace-{name}.txt")
        st = subprocess.Popen(
            ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync,sync_file_range", "-o", out, "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(strace_s)
        st.send_signal(signal.SIGINT)
        st.wait(30)
        fsyncs = 0
        with open(out) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync", "sync_file_range"):
                    fsyncs += int(parts[3])
        fsyncs /= strace_s
    st_json = json.loads(fleet.http_get(base + "/api/v1/status")[1] or "{}")
    wal = None
    if args.wal_frames and name == "full":
        frames, owner = wal_frames(data)
        commits = sum(1 for _, c in frames if c)
        counts = collections.Counter(owner.get(p, "page 1 / pointer map / free list") for p, _ in frames)
        wal = {"frames": len(frames), "commits": commits, "by_owner": dict(counts.most_common(16))}
    scrapes = None
    if prom_port:
        # Scrapes of the agent that succeeded, over the phase (`up` is 1 for each).
        q = f"http://127.0.0.1:{prom_port}/api/v1/query?query=sum_over_time(up[1d])"
        res = json.loads(fleet.http_get(q)[1] or "{}").get("data", {}).get("result", [])
        scrapes = int(float(res[0]["value"][1])) if res else 0
    if poller:
        stop_poll.set()
        poller.join(30)
    for p in extra:
        p.stop()
    agent.stop()
    if args.keep:
        shutil.copytree(data, os.path.join(args.keep, name), dirs_exist_ok=True)
    clk = os.sysconf("SC_CLK_TCK")
    half = rss[len(rss) // 2:] or rss or [0]
    hours = elapsed / 3600
    r = {
        "phase": name,
        "seconds": round(elapsed),
        "cpu_pct": 100.0 * (c1 - c0) / clk / elapsed,
        "rss_steady_mb": statistics.median(half) / 1024,
        "rss_peak_mb": hwm / 1024,
        "wakeups_per_s": (v1 - v0) / elapsed,
        "written_mb_per_h": (w1 - w0 + (ckpt_bytes or 0)) / 1e6 / hours,
        "checkpoint_written_mb_per_h": ckpt_bytes / 1e6 / hours if ckpt_bytes is not None else None,
        "store_growth_mb_per_h": (d1 - d0) / 1e6 / hours,
        "files_growth_mb_per_h": (f1 - f0) / 1e6 / hours,
        "device_written_mb_per_h": (s1 - s0) * 512 / 1e6 / hours if loopfs else None,
        "fsyncs_per_s": fsyncs,
        "io_by_thread": io,
        "wal_frames": wal,
        "wal_trace": wal_trace,
        "dirty_trace": dirty_trace,
        "points_written": st_json.get("ingest", {}).get("points_written"),
        # Points stored in the window (the counter above is since the agent started).
        "points_per_h": None,
        "points_dropped": st_json.get("ingest", {}).get("points_dropped"),
        "prometheus_scrapes": scrapes,
    }
    p1 = r["points_written"]
    if p0 is not None and p1 is not None and p1 > p0:
        r["points_per_h"] = (p1 - p0) / hours
        r["bytes_per_point"] = r["written_mb_per_h"] * 1e6 / r["points_per_h"]
    r["write_amplification"] = (
        r["written_mb_per_h"] / r["store_growth_mb_per_h"] if r["store_growth_mb_per_h"] > 0 else None
    )
    # The least this design can write: every page the store grew by once into the WAL and
    # once more when a checkpoint copies it into the database, and what each synced append of
    # the ingest journal costs (a 204 in `full` waits for it): its record padded to the
    # direct-IO block (512 bytes on this disk), or, where the file system refuses direct IO,
    # the whole page of the page cache it dirtied. The agent checkpoints every
    # 16 MiB of WAL (~45 min with everything on), so a shorter window usually holds no
    # checkpoint: its bytes then owe the second copy, and its own floor has one.
    r["journal_appends_per_h"] = (j1[0] - j0[0]) / hours
    r["journal_mb_per_h"] = (j1[1] - j0[1]) / hours / 1e6
    journal = r["journal_mb_per_h"]
    r["floor_mb_per_h"] = 2 * r["store_growth_mb_per_h"] + journal
    r["window_checkpointed"] = bool(args.checkpoint_window) or (k0 is not None and k1 is not None and k1 != k0)
    r["window_floor_mb_per_h"] = (2 if r["window_checkpointed"] else 1) * r["store_growth_mb_per_h"] + journal
    return r


def checkpoint(data, when):
    """Copies the store's WAL into its database completely (`wal_checkpoint(PASSIVE)` from a
    connection of this process, as the agent's own checkpoint at 16 MiB of WAL does) and
    syncs it; returns the bytes this process wrote doing so (its own write_bytes)."""
    before = write_bytes(os.getpid())
    c = sqlite3.connect(os.path.join(data, "edgewatch.db"), timeout=30)
    try:
        c.execute("PRAGMA synchronous = FULL")
        _, log, done = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        c.close()
    written = write_bytes(os.getpid()) - before
    print(f"    checkpoint {when}: {done} of {log} WAL frames copied, {written / 1e6:.2f} MB written", flush=True)
    return written


def wal_restarts(data):
    """The WAL header's checkpoint sequence number: it moves each time the WAL starts over
    after a complete checkpoint (None: no WAL yet)."""
    try:
        with open(os.path.join(data, "edgewatch.db-wal"), "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    return struct.unpack(">I", head[12:16])[0] if len(head) == 16 else None


def journal_appends(base):
    """The agent's synced journal appends so far and what they cost the storage, bytes
    (`ingest.journal_appends` and `ingest.journal_bytes` of its status; an agent too old to
    report the bytes: a page for each append)."""
    st = json.loads(fleet.http_get(base + "/api/v1/status")[1] or "{}")
    ingest = st.get("ingest", {})
    n = ingest.get("journal_appends", 0)
    return n, ingest.get("journal_bytes", n * PAGE)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "edgewatch"))
    ap.add_argument("--seconds", type=int, default=600, help="measured seconds per phase (default 600)")
    ap.add_argument("--warmup", type=int, default=30, help="seconds before measuring (default 30)")
    ap.add_argument("--strace", type=int, default=30, help="seconds of fsync counting at the end of the full phase (0: off)")
    ap.add_argument("--phases", default="full,ui,idle," + ",".join("no-" + p for p in PARTS))
    ap.add_argument("--io-trace", action="store_true",
                    help="in the strace window, also break bytes written and syncs down by thread and file")
    ap.add_argument("--wal-frames", action="store_true",
                    help="at the end of the full phase, count the WAL's frames by table and index (dbstat)")
    ap.add_argument("--wal-trace", action="store_true",
                    help="follow the WAL through each measured window: commits and pages an hour by the tables they write")
    ap.add_argument("--dirty-trace", action="store_true",
                    help="attribute the pages the agent dirties (what write_bytes counts) to files and "
                         "threads through the kernel's writeback_dirty_folio event (root, tracefs)")
    ap.add_argument("--device", action="store_true",
                    help="put each phase's store on an ext4 loop device of its own (root) and report the "
                         "bytes the block device was asked to write, file-system journal included")
    ap.add_argument("--mount-options", default="",
                    help="with --device: mount options of the store's file system (e.g. lazytime)")
    ap.add_argument("--checkpoint-at", type=float,
                    help="seconds into the warm-up at which to checkpoint the store's WAL completely "
                         "(PASSIVE, from a connection of its own), so that a long warm-up reaches the "
                         "WAL's reuse in place before the window")
    ap.add_argument("--checkpoint-window", action="store_true",
                    help="checkpoint the WAL completely at the window's start and again at its end, "
                         "counting the second checkpoint's bytes as written: a window of minutes then "
                         "includes the copy into the database that the agent's own checkpoint (every 16 MiB "
                         "of WAL, ~45 min with everything on) makes of what the window wrote")
    ap.add_argument("--prometheus", type=int, metavar="S",
                    help="run a real Prometheus (Debian's `prometheus`) scraping the agent's /metrics every S "
                         "seconds in each phase, and report its successful scrapes")
    ap.add_argument("--poll", type=float, metavar="S",
                    help="poll the API every S seconds as an app or dashboard does without "
                         "`X-Edgewatch-Read: stored` (an engine query and a raw query, each a read "
                         "of the latest)")
    ap.add_argument("--seed", metavar="DIR",
                    help="start each phase's agent on a copy of the store in DIR (a data directory, "
                         "e.g. one `--keep` left): the steady state of an older store without hours "
                         "of warm-up")
    ap.add_argument("--keep", help="copy each phase's stopped data directory to KEEP/PHASE (to inspect the store)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    # A SIGTERM (timeout, kill) unwinds like an exception, so every `finally` stops the
    # peers and the agent and unmounts and detaches a `--device` loop file system.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not os.path.exists(args.bin):
        subprocess.run(["cargo", "build", "--release", "--locked", "--bin", "edgewatch"], cwd=ROOT, check=True)
    for cmd, pkg in [("influxd", "influxdb"), ("mosquitto", "mosquitto"), ("prometheus-node-exporter", "prometheus-node-exporter")]:
        need(cmd, pkg)

    work = tempfile.mkdtemp(prefix="edgewatch-budget-")
    peers_procs = []
    triton = None
    results = []
    try:
        with open(os.path.join(ROOT, "crates/tegrastats-parser/tests/data/lines.tsv")) as f, open(
            os.path.join(work, "tegrastats.log"), "w"
        ) as out:
            for line in list(f)[1:]:
                out.write(line.rstrip("\n").split("\t")[4] + "\n")
        shutil.copytree(os.path.join(ROOT, "tests/data/jetson/agx-orin-jp5"), os.path.join(work, "jetson"), symlinks=True)
        ports = {"http": fleet.free_port(), "udp": fleet.free_port()}
        influx = fleet.Influxd(os.path.join(work, "influx"), fleet.free_port())
        influx.start()
        influx.create("edge")
        peers = {"influx": influx.port, "mqtt": fleet.free_port(), "node": fleet.free_port()}
        with open(os.path.join(work, "mosquitto.conf"), "w") as f:
            f.write(f"listener {peers['mqtt']} 127.0.0.1\nallow_anonymous true\n")
        peers_procs.append(Proc(["mosquitto", "-c", os.path.join(work, "mosquitto.conf")], os.path.join(work, "mosquitto.log")))
        peers_procs.append(
            Proc(["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{peers['node']}"], os.path.join(work, "node.log"))
        )
        triton = TritonPage()
        peers["triton"] = triton.port
        fleet.wait_until(10, lambda: fleet.http_get(f"http://127.0.0.1:{peers['node']}/metrics")[0] == 200)

        for phase in args.phases.split(","):
            phase = phase.strip()
            if phase == "full":
                off, ui = set(), False
            elif phase == "ui":
                off, ui = set(), True
            elif phase == "idle":
                off, ui = {"client", "sinks", "scrapes", "alerts"}, False
            elif phase.startswith("no-") and phase[3:] in PARTS:
                off, ui = {phase[3:]}, False
            else:
                raise SystemExit(f"unknown phase {phase}")
            strace_s = args.strace if phase == "full" else 0
            print(f"==> {phase}: {args.seconds} s (+{args.warmup} s warm-up)", flush=True)
            r = run_phase(phase, args, work, ports, peers, off, ui, args.seconds, strace_s)
            results.append(r)
            print("    " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    finally:
        if triton:
            triton.stop()
        for p in peers_procs:
            p.stop()
        try:
            influx.stop()
        except NameError:
            pass
        shutil.rmtree(work, ignore_errors=True)

    full = next((r for r in results if r["phase"] == "full"), None)
    print()
    print(f"edgewatch device budget: {args.bin} ({os.path.getsize(args.bin) / 1e6:.2f} MB), {os.cpu_count()} CPUs, {args.seconds} s per phase")
    print("| phase | CPU % of a core | RSS steady / peak MB | wakeups/s | written MB/h | store growth MB/h | written / growth | share of full CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        share = ""
        if full and r["phase"].startswith("no-"):
            share = f"{full['cpu_pct'] - r['cpu_pct']:+.3f} pts"
        wa = f"{r['write_amplification']:.1f}x" if r["write_amplification"] else "-"
        print(
            f"| {r['phase']} | {r['cpu_pct']:.3f} | {r['rss_steady_mb']:.1f} / {r['rss_peak_mb']:.1f} | "
            f"{r['wakeups_per_s']:.1f} | {r['written_mb_per_h']:.2f} | {r['store_growth_mb_per_h']:.2f} | {wa} | {share} |"
        )
    for r in results:
        if r.get("device_written_mb_per_h") is not None:
            g = r["store_growth_mb_per_h"]
            ratio = f" ({r['device_written_mb_per_h'] / g:.1f}x the growth)" if g > 0 else ""
            print(f"{r['phase']}: the block device was asked to write {r['device_written_mb_per_h']:.2f} MB/h{ratio}, "
                  f"against {r['written_mb_per_h']:.2f} MB/h of write_bytes (ext4, its journal included)")
    for r in results:
        g = r["store_growth_mb_per_h"]
        if g > 0 and r["phase"] in ("full", "ui", "idle"):
            wf = r["window_floor_mb_per_h"]
            held = ("held a checkpoint, so its floor has both copies" if r["window_checkpointed"]
                    else "held no checkpoint (its growth's second copy falls due later), so its floor "
                         "has one copy")
            print(f"{r['phase']}: the floor of this design over a long run is {r['floor_mb_per_h']:.2f} MB/h "
                  f"({r['floor_mb_per_h'] / g:.1f}x the growth): 2 x {g:.2f} MB/h of growth (WAL, then "
                  f"checkpoint) + {r['journal_appends_per_h']:.0f} synced journal appends/h costing "
                  f"{r['journal_mb_per_h']:.2f} MB/h; "
                  f"this window {held}: {wf:.2f} MB/h ({wf / g:.1f}x), and it wrote "
                  f"{r['written_mb_per_h'] - wf:.2f} MB/h above that")
    for r in results:
        if r.get("bytes_per_point"):
            print(f"{r['phase']}: {r['points_per_h']:.0f} points stored an hour in the window, "
                  f"{r['bytes_per_point']:.1f} bytes written a point")
    if full and full["fsyncs_per_s"] is not None:
        print(f"fsync/fdatasync calls per second (full, last {args.strace} s under strace): {full['fsyncs_per_s']:.2f}")
    if full and full.get("io_by_thread"):
        print(f"bytes written and syncs by thread and file (full, last {args.strace} s under strace):")
        print("| thread | file | MB/h | write calls/s | syncs/s |")
        print("|---|---|---|---|---|")
        for key, v in full["io_by_thread"].items():
            thread, _, file = key.partition(" ")
            print(f"| {thread} | {file} | {v['mb_per_h']:.1f} | {v['calls_per_s']:.2f} | {v['syncs_per_s']:.2f} |")
    if full and full.get("wal_frames"):
        w = full["wal_frames"]
        print(f"WAL at the end of the full phase: {w['frames']} frames in {w['commits']} commits; frames by owner:")
        for owner, n in w["by_owner"].items():
            print(f"  {n:7d}  {n / max(1, w['commits']):7.2f} per commit  {owner}")
    for r in results:
        w = r.get("wal_trace")
        if not w:
            continue
        print(f"WAL traced through {r['phase']}: {w['commits_per_h']} commits/h, {w['pages_per_h']} pages/h "
              f"({w['wal_mb_per_h']} MB/h), {w['generations']} generations; by the tables a commit writes:")
        print("| commit writes | commits/h | pages/h | pages per commit |")
        print("|---|---|---|---|")
        for k, v in w["by_kind"].items():
            print(f"| {k} | {v['commits_per_h']} | {v['pages_per_h']} | {v['pages_per_h'] / max(1, v['commits_per_h']):.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    ok = True
    if full:
        ok &= full["cpu_pct"] < 1.0 and full["rss_steady_mb"] < 25
        # A store that did not grow (at its disk budget, evicting as much as it writes) has
        # no ratio: its bytes written cannot be judged against growth, so the target is not met.
        ok &= full["write_amplification"] is not None and full["write_amplification"] <= 3
        if full["write_amplification"] is None:
            print("full: the store did not grow in the window (at its disk budget?): written MB/h and bytes a point are the figures")
    idle = next((r for r in results if r["phase"] == "idle"), None)
    if idle:
        ok &= idle["cpu_pct"] < 0.2
    print("targets (full < 1 % CPU and < 25 MB; idle < 0.2 %; written <= 3x growth):", "MET" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
