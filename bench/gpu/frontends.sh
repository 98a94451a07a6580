#!/usr/bin/env bash
# Frontend processes on a GPU machine, in one device-tool call (bench/README.md, "On the device tool's GPU machine"):
# small requests through Triton's perf_analyzer with 1, 2, 4 and 8 frontends, then ResNet-50 (two process
# instances) and the encoder served with 1, 2, 4 and 8 frontends against their direct-call limits.
#
#   carry: [".whl", ".pa"]    (bash bench/gpu/wheels.sh; .pa/: perf_analyzer, libb64.so.0d and libcudart.so.12)
#   bash bench/gpu/frontends.sh                  # on the GPU machine; results in $OUT
#   BENCH_DEVICE=cpu BENCH_SIZE=tiny BENCH_QUICK=1 bash bench/gpu/frontends.sh   # a dry run here, on a CPU
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/bench-frontends-out}
mkdir -p "$out"
if [ -d .whl ] && [ -n "$(ls .whl 2>/dev/null)" ] && [ -z "${BENCH_NO_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
fi
export PYTHONUNBUFFERED=1
python=${BENCH_PYTHON:-python3}
if [ -x .pa/perf_analyzer ]; then
  mkdir -p /tmp/pa && cp .pa/perf_analyzer /tmp/pa/ && cp -r .pa/lib /tmp/pa/
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/pa/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec /tmp/pa/perf_analyzer "$@"\n' >/tmp/pa/run
  chmod +x /tmp/pa/run
  export BENCH_PERF_ANALYZER=/tmp/pa/run
fi
(nvidia-smi -L || true; nproc; "$python" --version) 2>&1 | tee "$out/machine.txt"
device=${BENCH_DEVICE:-cuda}
size=${BENCH_SIZE:-full}
if [ -n "${BENCH_QUICK:-}" ]; then
  counts=1,2; points=4; seconds=1; pa_seconds=2
else
  counts=1,2,4,8; points=32,128,256; seconds=3; pa_seconds=4
fi
timeout 240 "$python" -m bench frontends --counts "$counts" --rows pa_http,pa_grpc --pa-concurrency 256 --rounds 1 \
  --duration "$pa_seconds" --json "$out/small.json" 2>&1 | tee "$out/small.log"
timeout 360 "$python" -m bench gpu --models resnet50 --process-instances --frontends "$counts" --device "$device" \
  --size "$size" --in-flight "$points" --duration "$seconds" --warmup 1 --results-dir "$out" 2>&1 | tee "$out/resnet50.log"
timeout 150 "$python" -m bench gpu --models encoder --frontends "${counts%%,*},${counts##*,}" --device "$device" \
  --size "$size" --in-flight "${points##*,}" --duration "$seconds" --warmup 1 --results-dir "$out" 2>&1 | tee "$out/encoder.log"
