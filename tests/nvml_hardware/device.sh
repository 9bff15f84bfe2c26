#!/usr/bin/env bash
# The whole prepared check for a machine with an NVIDIA GPU, in one run (from the repository
# root): the NVML path (check.sh: `gpus`, a 20 s `run`, the stored gpu points) and the Python
# client's CUDA-event path (test_cuda_events.py: real torch.cuda events and kernels against
# the agent). AGENT_BIN names a prebuilt agent (else check.sh builds one); results under $OUT.
set -u
OUT=${OUT:-./nvml-hardware-out}
mkdir -p "$OUT"
export OUT
nvidia-smi >"$OUT/nvidia-smi-full.txt" 2>&1 || true
uname -a >"$OUT/uname.txt"; ldd --version 2>&1 | head -1 >>"$OUT/uname.txt"
bash tests/nvml_hardware/check.sh 2>&1 | tee "$OUT/check.txt"
BIN=${AGENT_BIN:-target/release/edgewatch}
EDGEWATCH_BIN="$BIN" PYTHONUNBUFFERED=1 timeout 300 python3 -m pytest -q -s -p no:cacheprovider \
    tests/nvml_hardware/test_cuda_events.py 2>&1 | tee "$OUT/cuda_events.txt"
echo "cuda events: exit ${PIPESTATUS[0]}" | tee -a "$OUT/cuda_events.txt"
