#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need (Debian packages
# for the real peers, the Python Influx client libraries), then runs formatting, lint and
# every test of the workspace. Usage: ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# A run from a fresh clone gains nothing from incremental caches (4 GB of the 9 GB a debug
# target/ reached), and line tables keep test backtraces readable at a fraction of full
# debug info's size. The CI machine's disk is shared: a full disk failed a run.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

need_apt=()
command -v influxd >/dev/null 2>&1 || need_apt+=(influxdb)
command -v mosquitto >/dev/null 2>&1 || need_apt+=(mosquitto)
command -v mosquitto_sub >/dev/null 2>&1 || need_apt+=(mosquitto-clients)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v strace >/dev/null 2>&1 || need_apt+=(strace)
command -v mkfs.ext4 >/dev/null 2>&1 || need_apt+=(e2fsprogs)
command -v prometheus-node-exporter >/dev/null 2>&1 || need_apt+=(prometheus-node-exporter)
command -v prometheus-alertmanager >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)
command -v victoria-metrics >/dev/null 2>&1 || need_apt+=(victoria-metrics)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
/usr/bin/python3 -c 'import fusepy' >/dev/null 2>&1 || need_apt+=(python3-fusepy)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "==> installing Debian packages: ${need_apt[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian starts packaged daemons where it can; the tests start their own on free ports.
for svc in influxdb mosquitto prometheus prometheus-node-exporter prometheus-alertmanager victoria-metrics; do
    (command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1) || true
done

if ! python3 -c 'import influxdb, influxdb_client' >/dev/null 2>&1; then
    echo "==> installing Python Influx client libraries"
    python3 -m pip install --quiet --disable-pip-version-check influxdb influxdb-client 2>&1 | grep -v "Running pip as the 'root' user" || true
fi

# The Python client's tests (clients/python): pytest, a real onnxruntime (CPU) with onnx to
# build its model, a real torch (PyPI's only Linux x86-64 build: about 3 GB of CUDA
# wheels, installed once; the tests run it on the CPU), the openai client and
# transformers with its `serving` extras (`transformers serve`, an OpenAI-compatible
# server, runs a tiny model the tests build). Checked by import name, installed by
# PyPI name.
need_pip=()
for spec in pytest onnx onnxruntime torch openai "fastapi:transformers[serving]" "uvicorn:transformers[serving]" "transformers:transformers[serving]"; do
    mod="${spec%%:*}" pkg="${spec#*:}"
    python3 -c "import $mod" >/dev/null 2>&1 || [[ " ${need_pip[*]} " == *" $pkg "* ]] || need_pip+=("$pkg")
done
if [ ${#need_pip[@]} -gt 0 ]; then
    echo "==> installing Python client test packages: ${need_pip[*]}"
    python3 -m pip install --quiet --disable-pip-version-check "${need_pip[@]}" 2>&1 | grep -v "Running pip as the 'root' user" || true
fi

if [ ! -d tests/web/node_modules/playwright-core ]; then
    echo "==> installing playwright-core (drives Debian's chromium in the UI test)"
    npm install --no-save --no-audit --no-fund --silent --prefix tests/web playwright-core@1
fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> module cycles (scripts/module-cycles.py)"
python3 scripts/module-cycles.py
echo "==> cargo test"
cargo test --workspace --locked
echo "==> python client tests"
# The agent binary `cargo test` just built (a separate `cargo build` would rebuild it
# without the test-fakes feature, and `cargo test` would then rebuild it again).
agent_bin="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug/edgewatch"
[ -x "$agent_bin" ] || cargo build --locked --bin edgewatch
EDGEWATCH_BIN="$agent_bin" python3 -m pytest -q -p no:cacheprovider clients/python
echo "==> aarch64 cross build, emulated smoke test and .deb check"
./scripts/smoke-aarch64.sh
echo "==> all tests passed"
