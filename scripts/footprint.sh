#!/usr/bin/env bash
# Measures edgewatch's footprint with public tools: /proc/PID/status (VmRSS, VmHWM),
# /proc/PID/stat (utime + stime) and /usr/bin/time -v.
#
# One agent runs on a temporary config: free loopback ports, a temp data dir, the host
# collector at its default interval, the tegrastats collector replaying the fixture lines of
# crates/tegrastats-parser/tests/data/lines.tsv at 1 Hz. After a 10 s warm-up:
#   idle phase  FOOTPRINT_IDLE_SECONDS (default: FOOTPRINT_SECONDS): collectors only;
#   load phase  FOOTPRINT_SECONDS (default 300): plus a load generator that POSTs one
#               /write per second of 100 lines with 100 distinct tag sets (100 series/s).
# RSS and CPU time are sampled every 10 s. Printed: CPU % of one core in each phase, steady
# RSS under load (median of the last half of the load samples), peak RSS (VmHWM), what the
# agent stored, and the budget verdict (steady RSS <= 20 MB, idle CPU < 0.5 %).
#
# Usage: scripts/footprint.sh [BINARY]     (default: target/release/edgewatch, built if missing)
#   FOOTPRINT_SECONDS=60 scripts/footprint.sh      quick run
#   FOOTPRINT_EXTRA_CONFIG=$'[rollup]\nenabled = false'  TOML appended to the config (not
#                                                   the http/udp/storage/tegrastats/log tables)
#   FOOTPRINT_OUT=DIR                               samples.csv, agent.log, time.txt, summary.txt
#                                                   (default: ${CARGO_TARGET_DIR:-target}/footprint)
set -euo pipefail
cd "$(dirname "$0")/.."

load_s=${FOOTPRINT_SECONDS:-300}
idle_s=${FOOTPRINT_IDLE_SECONDS:-$load_s}
warmup_s=10
interval_s=10
rss_budget_kb=$((20 * 1024))
idle_cpu_budget_pct=0.5

bin=${1:-${CARGO_TARGET_DIR:-target}/release/edgewatch}
if [ ! -x "$bin" ]; then
    echo "==> building $bin"
    cargo build --release --locked --bin edgewatch
fi
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time missing (apt-get install time)" >&2; exit 1; }

out=${FOOTPRINT_OUT:-${CARGO_TARGET_DIR:-target}/footprint}
mkdir -p "$out"
work=$(mktemp -d)
time_pid=""
gen_pid=""
cleanup() {
    [ -n "$gen_pid" ] && kill "$gen_pid" 2>/dev/null || true
    [ -n "$time_pid" ] && kill -KILL "$time_pid" 2>/dev/null || true
    [ -n "${agent_pid:-}" ] && kill -KILL "$agent_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

tail -n +2 crates/tegrastats-parser/tests/data/lines.tsv | cut -f5 >"$work/tegrastats.log"
read -r http_port udp_port < <(python3 -c '
import socket
t = socket.socket(); t.bind(("127.0.0.1", 0))
u = socket.socket(type=socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
print(t.getsockname()[1], u.getsockname()[1])')
# Everything not set here keeps the built-in default (host collector every 10 s, queue,
# batch sizes, synchronous = "normal").
cat >"$work/edgewatch.toml" <<EOF
[http]
listen = "127.0.0.1:$http_port"
[udp]
listen = "127.0.0.1:$udp_port"
[storage]
data_dir = "$work/data"
[tegrastats]
replay = "$work/tegrastats.log"
interval = "1s"
[log]
level = "warn"
${FOOTPRINT_EXTRA_CONFIG:-}
EOF
"$bin" check-config "$work/edgewatch.toml" >/dev/null

/usr/bin/time -v -o "$out/time.txt" "$bin" run --config "$work/edgewatch.toml" 2>"$out/agent.log" &
time_pid=$!
agent_pid=""
for _ in $(seq 1 100); do
    agent_pid=$(pgrep -P "$time_pid" || true)
    [ -n "$agent_pid" ] && break
    sleep 0.05
done
[ -n "$agent_pid" ] || { echo "error: agent did not start" >&2; cat "$out/agent.log" >&2; exit 1; }
base="http://127.0.0.1:$http_port"
for _ in $(seq 1 100); do
    curl -fsS "$base/health" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "$base/health" >/dev/null || { echo "error: /health not answering" >&2; cat "$out/agent.log" >&2; exit 1; }

clk=$(getconf CLK_TCK)
cpu_ticks() { sed 's/.*) //' "/proc/$agent_pid/stat" | awk '{print $12 + $13}'; }
status_kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$agent_pid/status"; }
echo "phase,t_s,vmrss_kb,vmhwm_kb,rssanon_kb,rssfile_kb,rssshmem_kb,cpu_ticks" >"$out/samples.csv"
sample() {
    echo "$1,$2,$(status_kb VmRSS),$(status_kb VmHWM),$(status_kb RssAnon),$(status_kb RssFile),$(status_kb RssShmem),$(cpu_ticks)" >>"$out/samples.csv"
}
# Samples every $interval_s for $2 seconds, labelled $1; sets phase_ticks to the CPU ticks
# used in the phase.
run_phase() {
    local phase=$1 secs=$2 start_ticks t=0 next
    start_ticks=$(cpu_ticks)
    sample "$phase" 0
    local t0 now
    t0=$(date +%s.%N)
    while [ "$t" -lt "$secs" ]; do
        t=$((t + interval_s))
        [ "$t" -gt "$secs" ] && t=$secs
        next=$(python3 -c "print(max(0.0, $t0 + $t - $(date +%s.%N)))")
        sleep "$next"
        sample "$phase" "$t"
    done
    phase_ticks=$(($(cpu_ticks) - start_ticks))
}

echo "==> edgewatch footprint: $bin ($(stat -c %s "$bin") bytes), pid $agent_pid, $base"
echo "    warm-up ${warmup_s} s, idle ${idle_s} s, load ${load_s} s (100 series/s), sample every ${interval_s} s"
sleep "$warmup_s"
run_phase idle "$idle_s"
idle_ticks=$phase_ticks
points_before_load=$(curl -fsS "$base/api/v1/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ingest"]["points_written"])')

# The load generator: one HTTP write per second of 100 lines, one series each, on one
# keep-alive connection (what an Influx client library does).
python3 - "$http_port" "$load_s" "$work/gen.json" <<'EOF' &
import http.client, json, random, sys, time
port, secs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
codes = {}
start = time.monotonic()
for k in range(secs):
    delay = start + k - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    ts = time.time_ns()
    body = "".join(
        f"inference,app=footprint,model=m{i:03d} wall_ms={random.uniform(5, 50):.3f} {ts}\n"
        for i in range(100)
    ).encode()
    try:
        conn.request("POST", "/write?precision=ns", body)
        r = conn.getresponse()
        r.read()
        codes[r.status] = codes.get(r.status, 0) + 1
    except Exception as e:
        codes[type(e).__name__] = codes.get(type(e).__name__, 0) + 1
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
json.dump({"requests": secs, "codes": {str(c): n for c, n in codes.items()}}, open(out, "w"))
EOF
gen_pid=$!
run_phase load "$load_s"
load_ticks=$phase_ticks
wait "$gen_pid" || true
gen_pid=""
curl -fsS "$base/api/v1/status" >"$work/status.json"
curl -fsS "$base/api/v1/series?measurement=inference" >"$work/series.json"
hwm_kb=$(status_kb VmHWM)

kill -TERM "$agent_pid"
wait "$time_pid" || true
time_pid=""

python3 - "$out/samples.csv" "$clk" "$idle_s" "$load_s" "$idle_ticks" "$load_ticks" "$hwm_kb" \
    "$rss_budget_kb" "$idle_cpu_budget_pct" "$work/gen.json" "$points_before_load" \
    "$out/time.txt" "$bin" "$work/status.json" "$work/series.json" <<'EOF' | tee "$out/summary.txt"
import csv, json, os, platform, statistics, sys
(samples, clk, idle_s, load_s, idle_t, load_t, hwm, rss_budget, cpu_budget, gen, before,
 timef, binary, statusf, seriesf) = sys.argv[1:]
clk, idle_s, load_s, idle_t, load_t, hwm, rss_budget = map(int, (clk, idle_s, load_s, idle_t, load_t, hwm, rss_budget))
rows = list(csv.DictReader(open(samples)))
load = [int(r["vmrss_kb"]) for r in rows if r["phase"] == "load"]
idle = [int(r["vmrss_kb"]) for r in rows if r["phase"] == "idle"]
steady = statistics.median(load[len(load) // 2:])
idle_cpu = 100.0 * idle_t / clk / idle_s
load_cpu = 100.0 * load_t / clk / load_s
status = json.load(open(statusf))
listing = json.load(open(seriesf))
# The listing is paged: its first page says how many series match.
series = range(listing.get("total", len(listing["series"])))
g = json.load(open(gen))
tv = {}
for line in open(timef):
    if ": " in line:
        k, v = line.strip().split(": ", 1)
        tv[k] = v
mb = lambda kb: kb / 1024
print(f"edgewatch footprint on {platform.machine()}, {os.cpu_count()} CPUs; binary {binary} ({os.path.getsize(binary) / 1e6:.2f} MB)")
print(f"  idle  {idle_s} s (host collector every 10 s + tegrastats replay at 1 Hz): CPU {idle_cpu:.3f} % of a core; RSS {mb(min(idle)):.1f}-{mb(max(idle)):.1f} MB")
print(f"  load  {load_s} s (+ 100 series/s over HTTP, {g['requests']} writes: {g['codes']}): CPU {load_cpu:.3f} % of a core")
last = [r for r in rows if r["phase"] == "load"][-1]
print(f"        steady RSS {mb(steady):.1f} MB (median of the last {len(load) - len(load) // 2} samples), RSS range {mb(min(load)):.1f}-{mb(max(load)):.1f} MB")
print(f"        last sample: anonymous {mb(int(last['rssanon_kb'])):.1f} MB, file-backed {mb(int(last['rssfile_kb'])):.1f} MB, shared memory {mb(int(last['rssshmem_kb'])):.1f} MB")
# Trend over the last half of the load phase (least squares), MB per minute.
half = [(int(r["t_s"]), int(r["vmrss_kb"])) for r in rows if r["phase"] == "load"]
half = half[len(half) // 2:]
slope = 0.0
if len(half) >= 3:
    mt = sum(t for t, _ in half) / len(half)
    mr = sum(v for _, v in half) / len(half)
    den = sum((t - mt) ** 2 for t, _ in half)
    slope = sum((t - mt) * (v - mr) for t, v in half) / den * 60 / 1024 if den else 0.0
print(f"        RSS trend over the last half of the load phase: {slope:+.2f} MB/min" +
      (" (too few samples)" if len(half) < 3 else
       "  <- still growing: not steady yet, run longer" if slope > 0.05 else " (steady)"))
print(f"  peak RSS (VmHWM) {mb(hwm):.1f} MB; /usr/bin/time -v: max RSS {int(tv.get('Maximum resident set size (kbytes)', 0)) / 1024:.1f} MB, user {tv.get('User time (seconds)')} s, system {tv.get('System time (seconds)')} s, elapsed {tv.get('Elapsed (wall clock) time (h:mm:ss or m:ss)')}")
ing = status["ingest"]
print(f"  stored: {ing['points_written']} points ({ing['points_written'] - int(before)} during load), rejected {ing['points_rejected']}, dropped {ing['points_dropped']}, commits {ing['commits']}; inference series {len(series)}, all series {status['store']['series']}, db {status['store']['db_bytes'] / 1e6:.1f} MB")
ok_rss = steady <= rss_budget
ok_cpu = idle_cpu < float(cpu_budget)
print(f"  budget: steady RSS <= {mb(rss_budget):.0f} MB: {'PASS' if ok_rss else 'FAIL'}" +
      (" (WARNING: RSS still growing)" if slope > 0.05 else "") +
      f"; idle CPU < {cpu_budget} %: {'PASS' if ok_cpu else 'FAIL'}")
sys.exit(0 if ok_rss and ok_cpu else 1)
EOF
