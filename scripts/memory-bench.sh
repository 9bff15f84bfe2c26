#!/usr/bin/env bash
# Memory at high cardinality: steady and peak RSS of the agent holding N series, while it
# answers the read paths that used to build their whole answer in memory.
#
# For each N (default: 1000 10000 100000) one agent runs on a temporary config (free
# loopback ports, a temp data dir, collectors off, max_series = N + 1000) and:
#   1. writes N series over HTTP /write (`bench,req=<i> value=<x>`, one tag set per series,
#      batches of 10,000 lines, timestamps within the last minute: all of them fresh for
#      /metrics), then waits 5 s;
#   2. steady RSS: VmRSS from /proc/PID/status; the peak (VmHWM) is then reset through
#      /proc/PID/clear_refs;
#   3. the read sequence: 3 x GET /metrics (timed), the whole series listing
#      (/api/v1/series, every page of 10,000), a raw query and an aggregate query over the
#      measurement (either may be cut or refused by the answer bounds), /api/v1/fields, a
#      filtered page, the UI's files, /api/v1/status, and 2 more /metrics;
#   4. a second round of N points and the rollup job folding it (interval 2 s);
#   5. peak RSS: VmHWM.
# Printed: one markdown row per N (the table in docs/performance.md) with steady RSS, peak RSS, peak/steady,
# RSS per series (steady RSS growth over the idle agent / N: the dictionary, the writer's
# cache, the newest values), the first and median /metrics time and its size.
#
# Usage: scripts/memory-bench.sh [BINARY]   (default: target/release/edgewatch, built if
#        missing)
#   MEMORY_BENCH_SERIES="1000 10000"        other series counts
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-${CARGO_TARGET_DIR:-target}/release/edgewatch}
if [ ! -x "$bin" ]; then
    echo "==> building $bin"
    cargo build --release --locked --bin edgewatch
fi
command -v curl >/dev/null || { echo "error: curl missing (apt-get install curl)" >&2; exit 1; }

work=$(mktemp -d)
agent_pid=""
cleanup() {
    [ -n "$agent_pid" ] && kill -KILL "$agent_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

run_one() {
    local n=$1 port dir
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    dir="$work/n$n"
    mkdir -p "$dir"
    cat >"$dir/edgewatch.toml" <<EOF
[http]
listen = "127.0.0.1:$port"
[udp]
enabled = false
[storage]
data_dir = "$dir/data"
max_series = $((n + 1000))
synchronous = "normal"
[host]
enabled = false
[tegrastats]
enabled = false
[nvml]
enabled = false
[health]
enabled = false
[rollup]
interval = "2s"
[log]
level = "warn"
EOF
    "$bin" run --config "$dir/edgewatch.toml" 2>"$dir/agent.log" &
    agent_pid=$!
    local base="http://127.0.0.1:$port"
    for _ in $(seq 1 100); do
        curl -fsS "$base/health" >/dev/null 2>&1 && break
        sleep 0.1
    done
    local idle_kb
    idle_kb=$(kb "$agent_pid" VmRSS)

    # 1. N series, in batches of 10,000 lines, all within the last minute; the rollup job
    #    (every 2 s here) folds them before the steady reading.
    write_round() {
        local now_ms i
        now_ms=$(($(date +%s%N) / 1000000))
        for ((i = 0; i < n; i += 10000)); do
            awk -v from="$i" -v to="$n" -v t="$now_ms" 'BEGIN {
                end = from + 10000; if (end > to) end = to;
                for (j = from; j < end; j++) printf "bench,req=r%07d,host=dev value=%d.5 %.0f\n", j, j % 977, t - (j % 50000)
            }' >"$dir/batch.lp"
            curl -fsS -o /dev/null --data-binary @"$dir/batch.lp" "$base/write?precision=ms"
        done
    }
    rolled_up() {
        for _ in $(seq 1 600); do
            curl -fsS "$base/api/v1/status" | python3 -c 'import json,sys; t=json.load(sys.stdin)["rollup"]["tiers"]; sys.exit(0 if all(x["pending_chunks"] == 0 for x in t) else 1)' && return 0
            sleep 0.5
        done
        echo "rollup did not catch up" >&2
    }
    write_round
    rolled_up
    sleep 3
    local steady_kb
    steady_kb=$(kb "$agent_pid" VmRSS)
    echo 5 >"/proc/$agent_pid/clear_refs"

    # 3. The read sequence.
    local times=() t size=0 first=""
    for _ in 1 2 3; do
        t=$(curl -fsS -o "$dir/metrics.txt" -w '%{time_total}' "$base/metrics")
        times+=("$t")
        [ -z "$first" ] && first=$t
    done
    size=$(wc -c <"$dir/metrics.txt")
    local cursor="" listed=0 page
    while :; do
        page=$(curl -fsS "$base/api/v1/series?limit=10000${cursor:+&cursor=$cursor}")
        listed=$((listed + $(printf '%s' "$page" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["series"]))')))
        cursor=$(printf '%s' "$page" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("next") or "")')
        [ -z "$cursor" ] && break
    done
    curl -fsS -o /dev/null "$base/api/v1/query?measurement=bench&field=value&from=-10m" || true
    curl -fs -o /dev/null "$base/api/v1/query?measurement=bench&field=value&from=-10m&step=1m&agg=p99&group_by=host" || true
    curl -fsS -o /dev/null "$base/api/v1/fields" || true
    curl -fsS -o /dev/null "$base/api/v1/series?limit=200&match=r00012" || true
    curl -fsS -o /dev/null "$base/"
    curl -fsS -o /dev/null "$base/assets/app.js"
    curl -fsS -o /dev/null "$base/api/v1/status"
    for _ in 1 2; do
        t=$(curl -fsS -o /dev/null -w '%{time_total}' "$base/metrics")
        times+=("$t")
    done
    # 4. Forwarding-free write path and a rollup run over every series again.
    write_round
    rolled_up
    local peak_kb samples
    peak_kb=$(kb "$agent_pid" VmHWM)
    samples=$(grep -c '^bench_value' "$dir/metrics.txt" || true)
    kill -TERM "$agent_pid"
    wait "$agent_pid" 2>/dev/null || true
    agent_pid=""
    local median
    median=$(printf '%s\n' "${times[@]:1}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    awk -v n="$n" -v s="$steady_kb" -v p="$peak_kb" -v idle="$idle_kb" -v f="$first" \
        -v m="$median" -v size="$size" -v listed="$listed" -v samples="$samples" 'BEGIN {
        printf "| %d | %.1f MB | %.1f MB | x%.2f | %.0f B | %.3f s | %.3f s | %.1f MB (%d samples) | %d |\n",
            n, s / 1024, p / 1024, p / s, (s - idle) * 1024 / n, f, m, size / 1048576, samples, listed
    }'
}

echo "binary: $bin"
echo "| series | steady RSS | peak RSS | peak/steady | RSS per series | first /metrics | /metrics (median) | /metrics size | listed |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in ${MEMORY_BENCH_SERIES:-1000 10000 100000}; do
    run_one "$n"
done
