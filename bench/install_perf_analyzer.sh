#!/usr/bin/env bash
# Install Triton's perf_analyzer for the bench's perf_analyzer workloads, OUTSIDE the project's venv:
#
#   bash bench/install_perf_analyzer.sh [DEST]      # DEST defaults to /tmp/perf-analyzer
#
# perf_analyzer ships inside tritonclient 2.40.0's manylinux x86_64 wheel (the project itself needs
# tritonclient >= 2.45, which no longer carries it: the wheel is only unpacked here, never installed).
# It loads libb64 (Debian's libb64-0d) and libcudart.so.12 (taken from the nvidia-cuda-runtime-cu12
# wheel; loaded, not used: no GPU is needed). DEST/perf_analyzer is a wrapper that sets LD_LIBRARY_PATH
# and runs DEST/bin/perf_analyzer; the bench looks for it there (`--perf-analyzer PATH` otherwise).
set -euo pipefail

DEST=${1:-/tmp/perf-analyzer}
PYTHON=${PYTHON:-python3}
TRITONCLIENT=2.40.0
CUDART=12.9.79

if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    echo "perf_analyzer's wheel is for Linux x86_64 only" >&2
    exit 1
fi
mkdir -p "$DEST/wheels" "$DEST/bin" "$DEST/lib"

download() {  # a wheel by requirement, for manylinux x86_64 whatever this interpreter is
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform "$2" \
        --python-version 3.11 --dest "$DEST/wheels" "$1"
}
download "tritonclient==$TRITONCLIENT" manylinux1_x86_64
download "nvidia-cuda-runtime-cu12==$CUDART" manylinux2014_x86_64

"$PYTHON" - "$DEST" "$TRITONCLIENT" <<'EOF'
import glob, os, sys, zipfile
dest, version = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{dest}/wheels/tritonclient-{version}-*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    with open(f"{dest}/bin/perf_analyzer", "wb") as out:
        out.write(archive.read(f"tritonclient-{version}.data/data/bin/perf_analyzer"))
os.chmod(f"{dest}/bin/perf_analyzer", 0o755)
cudart = glob.glob(f"{dest}/wheels/nvidia_cuda_runtime_cu12-*.whl")[0]
with zipfile.ZipFile(cudart) as archive:
    with open(f"{dest}/lib/libcudart.so.12", "wb") as out:
        out.write(archive.read("nvidia/cuda_runtime/lib/libcudart.so.12"))
EOF

if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y libb64-0d >/dev/null || { apt-get update >/dev/null && apt-get install -y libb64-0d >/dev/null; }
    else
        echo "libb64 is missing: run 'sudo apt-get install -y libb64-0d'" >&2
        exit 1
    fi
fi

cat > "$DEST/perf_analyzer" <<'EOF'
#!/bin/sh
# perf_analyzer with the libcudart it loads (installed by bench/install_perf_analyzer.sh)
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/perf_analyzer" "$@"
EOF
chmod +x "$DEST/perf_analyzer"
"$DEST/perf_analyzer" --version
