#!/usr/bin/env bash
# The NVML path against a real driver, for a machine with an NVIDIA GPU (run from the
# repository root): builds the agent (release), runs `edgewatch gpus`, then `edgewatch run`
# for 20 s with the NVML collector at 1 s and per-process samples on, and saves the
# report, the status (with `collectors.nvml.last_sample_us`, the wall time of the last
# sample), the stored `gpu`/`gpu_mig`/`gpu_process` points and the log under $OUT (default
# ./nvml-hardware-out). It only reads the GPU. `AGENT_BIN` skips the build; with
# LD_LIBRARY_PATH and NVML_STUB_SCENARIO it runs against the stand-in (a dry run).
set -u
OUT=${OUT:-./nvml-hardware-out}
mkdir -p "$OUT"
BIN=${AGENT_BIN:-}
if [ -z "$BIN" ]; then
    cargo build --release --bin edgewatch >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
    BIN=${CARGO_TARGET_DIR:-target}/release/edgewatch
fi
{ nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv 2>&1 || true; } >"$OUT/nvidia-smi.txt"
"$BIN" gpus >"$OUT/gpus.txt" 2>"$OUT/gpus.stderr"
echo "gpus: exit $?" | tee "$OUT/gpus.exit"
cat "$OUT/gpus.txt" "$OUT/gpus.stderr"

DIR=$(mktemp -d)
PORT=$(( 20000 + RANDOM % 20000 ))
cat >"$DIR/edgewatch.toml" <<CFG
[http]
listen = "127.0.0.1:$PORT"
[udp]
listen = "127.0.0.1:$(( PORT + 1 ))"
[storage]
data_dir = "$DIR/data"
[health]
enabled = false
[nvml]
interval = "1s"
processes = true
CFG
RUST_LOG=info "$BIN" run --config "$DIR/edgewatch.toml" 2>"$OUT/run.log" &
PID=$!
sleep 20
curl -s "http://127.0.0.1:$PORT/api/v1/status" >"$OUT/status.json"
for m in gpu gpu_mig gpu_process; do
    curl -s "http://127.0.0.1:$PORT/api/v1/query?measurement=$m&from=0&to=4000000000000000000" >"$OUT/$m.json"
done
kill -TERM "$PID"
wait "$PID"
echo "run: exit $?" | tee "$OUT/run.exit"
python3 - "$OUT/status.json" <<'PY' | tee "$OUT/summary.txt"
import json, sys
n = json.load(open(sys.argv[1]))["collectors"]["nvml"]
print("state:", n["state"], "| samples:", n["samples"], "| last_sample_us:", n["last_sample_us"])
for g in n["gpus"]:
    print("gpu", g["index"], g["name"], "lost" if g["lost"] else "ok", "unsupported:", ", ".join(g["unsupported"]) or "none")
PY
rm -rf "$DIR"
