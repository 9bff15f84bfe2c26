#!/usr/bin/env bash
# Emulated smoke test of the aarch64 (Jetson) build, on an x86-64 Debian/Ubuntu host.
#
# Cross-builds edgewatch for aarch64-unknown-linux-gnu (cross/build.sh), then runs that
# binary under Debian's qemu-user-static and checks that it
#   1. is an AArch64 ELF and prints `edgewatch <version>` for --version;
#   2. parses every tegrastats fixture line (crates/tegrastats-parser/tests/data/lines.tsv)
#      with `edgewatch tegrastats parse`, one JSON object per line;
#   3. runs the agent on free loopback ports (host collector on, tegrastats replay of the
#      same fixtures at 1 s), answers /health, accepts an HTTP line-protocol write (204) and
#      returns those exact points from /api/v1/query; replayed jetson_* series appear;
#   4. stops cleanly on SIGTERM, after which `edgewatch query` reads the points back;
#   5. packages into an arm64 .deb (packaging/build-deb.sh) that passes
#      packaging/verify-deb.sh (contents, conffile, check-config of the packaged config under
#      qemu, systemd-analyze verify of the unit where systemd-analyze is installed).
#
# Usage: scripts/smoke-aarch64.sh
#   SMOKE_BIN=PATH      test this aarch64 binary instead of building one
#   SMOKE_RELEASE=1     build the shipping profile (LTO, one codegen unit: slower) instead of the
#                       fast one (EDGEWATCH_FAST=1: no LTO, 16 codegen units)
#   CARGO_TARGET_DIR    as for cargo (default: ./target)
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need_apt=()
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
if [ -z "${SMOKE_BIN:-}" ]; then
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need_apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "==> installing Debian packages: ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

target=aarch64-unknown-linux-gnu
if [ -n "${SMOKE_BIN:-}" ]; then
    bin=$SMOKE_BIN
else
    if [ "${SMOKE_RELEASE:-0}" = 1 ]; then
        cross/build.sh "$target"
    else
        EDGEWATCH_FAST=1 cross/build.sh "$target"
    fi
    bin="${CARGO_TARGET_DIR:-target}/$target/release/edgewatch"
fi
t_built=$(date +%s)

# The dynamic loader and libc for aarch64 come from libc6-dev-arm64-cross / libc6-arm64-cross.
export QEMU_LD_PREFIX=${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}
qemu() { qemu-aarch64-static "$bin" "$@"; }

work=$(mktemp -d)
agent_pid=""
cleanup() {
    if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
        kill -KILL "$agent_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "SMOKE FAILED: $*" >&2
    if [ -f "$work/agent.log" ]; then
        echo "--- agent log (last 40 lines) ---" >&2
        tail -n 40 "$work/agent.log" >&2
    fi
    exit 1
}

echo "==> 1. binary and --version"
machine=$(LC_ALL=C readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
[ "$machine" = AArch64 ] || fail "$bin is not AArch64 (ELF machine: $machine)"
version=$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)
out=$(qemu --version) || fail "--version exited non-zero"
[ "$out" = "edgewatch $version" ] || fail "--version printed '$out', expected 'edgewatch $version'"
echo "    $out ($(stat -c %s "$bin") bytes)"

echo "==> 2. tegrastats parse of the fixtures"
fixtures=crates/tegrastats-parser/tests/data/lines.tsv
tail -n +2 "$fixtures" | cut -f5 >"$work/tegrastats.log"
n_lines=$(wc -l <"$work/tegrastats.log")
qemu tegrastats parse "$work/tegrastats.log" >"$work/parsed.jsonl" 2>"$work/parse.err" ||
    fail "tegrastats parse failed: $(head -5 "$work/parse.err")"
python3 - "$work/parsed.jsonl" "$n_lines" <<'EOF' || fail "tegrastats parse output is wrong"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = int(sys.argv[2])
assert len(rows) == want, f"{len(rows)} JSON objects for {want} lines"
for i, r in enumerate(rows, 1):
    assert r.get("line") == i, f"object {i}: line={r.get('line')}"
    assert r.get("ram"), f"line {i}: no RAM"
print(f"    {len(rows)} lines -> {len(rows)} JSON objects, each with RAM")
EOF

echo "==> 3. agent on free ports"
read -r http_port udp_port < <(python3 -c '
import socket
t = socket.socket(); t.bind(("127.0.0.1", 0))
u = socket.socket(type=socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
print(t.getsockname()[1], u.getsockname()[1])')
cat >"$work/edgewatch.toml" <<EOF
[http]
listen = "127.0.0.1:$http_port"
[udp]
listen = "127.0.0.1:$udp_port"
[storage]
data_dir = "$work/data"
[host]
interval = "1s"
[tegrastats]
replay = "$work/tegrastats.log"
interval = "1s"
EOF
qemu check-config "$work/edgewatch.toml" >/dev/null || fail "check-config rejected the smoke config"
qemu-aarch64-static "$bin" run --config "$work/edgewatch.toml" 2>"$work/agent.log" &
agent_pid=$!
base="http://127.0.0.1:$http_port"
for _ in $(seq 1 300); do
    curl -fsS "$base/health" >/dev/null 2>&1 && break
    kill -0 "$agent_pid" 2>/dev/null || fail "agent exited early"
    sleep 0.1
done
curl -fsS "$base/health" | grep -q '"ok"' || fail "/health did not answer within 30 s"
echo "    /health ok on $base"

now_ms=$(( $(date +%s) * 1000 ))
body=""
for i in 0 1 2 3 4; do
    body+="smoke,arch=aarch64,run=$$ latency_ms=$i.5,n=${i}i,ok=true $((now_ms - 5000 + i * 1000))"$'\n'
done
code=$(curl -sS -o "$work/write.out" -w '%{http_code}' -XPOST "$base/write?precision=ms" --data-binary "$body")
[ "$code" = 204 ] || fail "write answered $code: $(cat "$work/write.out")"
curl -fsS "$base/api/v1/query?measurement=smoke&field=latency_ms&tag.arch=aarch64&from=-1h" >"$work/query.json" ||
    fail "query failed"
python3 - "$work/query.json" "$now_ms" <<'EOF' || fail "query did not return the written points: $(head -c 600 "$work/query.json")"
import json, sys
q = json.load(open(sys.argv[1]))
now_ms = int(sys.argv[2])
series = q["series"]
assert len(series) == 1, f"{len(series)} series"
pts = series[0]["points"]
want = [[(now_ms - 5000 + i * 1000) * 1_000_000, i + 0.5] for i in range(5)]
assert pts == want, f"points {pts} != {want}"
print("    write 204; query returned the 5 points exactly")
EOF

# Collectors: host (1 s) and the tegrastats replay (1 s) show up as series.
ok=""
for _ in $(seq 1 60); do
    s=$(curl -fsS "$base/api/v1/series" || true)
    if grep -q '"jetson_mem"' <<<"$s" && grep -q '"host"' <<<"$s"; then ok=1; break; fi
    sleep 0.5
done
[ -n "$ok" ] || fail "no jetson_mem/host series after 30 s: $(head -c 400 <<<"$s")"
echo "    host and replayed jetson_* series present"

echo "==> 4. SIGTERM and direct read"
kill -TERM "$agent_pid"
rc=0
wait "$agent_pid" || rc=$?
agent_pid=""
[ "$rc" = 0 ] || fail "agent exited $rc after SIGTERM"
n=$(qemu query --data-dir "$work/data" --measurement smoke --field latency_ms --from -1h --format csv | tail -n +2 | wc -l)
[ "$n" = 5 ] || fail "edgewatch query read $n points after shutdown, expected 5"
echo "    clean exit; edgewatch query read the 5 points back"

echo "==> 5. arm64 package from this binary"
packaging/build-deb.sh "$bin" "$work/deb" | sed 's/^/    /'
packaging/verify-deb.sh "$work/deb/"edgewatch_*_arm64.deb | sed 's/^/    /'

t_end=$(date +%s)
echo "==> aarch64 smoke test passed (build $((t_built - t0)) s, checks $((t_end - t_built)) s)"
