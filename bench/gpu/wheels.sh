#!/usr/bin/env bash
# The wheels a GPU machine of the device tool lacks (it reaches no package registry), for CPython 3.12 on x86-64,
# downloaded into .whl/ at the repository root (git-ignored through info/exclude): see bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -rf .whl && mkdir .whl
# pytriton's dependencies that the machine's image does not hold (it has torch, numpy, grpcio, uvloop, wrapt,
# ml-dtypes, prometheus-client, nvidia-ml-py, cuda-bindings, matplotlib, psutil, pytest), tritonclient with its
# HTTP client's dependencies, the grpcio/protobuf pair tritonclient's gRPC stubs were built against, and py-spy
# (the bench's --py-spy).
WHEELS=(
  orjson==3.13.0 httptools==0.9.0 hpack==4.2.0
  tritonclient==2.73.0 python-rapidjson==1.25 geventhttpclient==2.6.1 gevent==26.9.0
  zope.event==6.2 zope.interface==8.7 greenlet==3.3.2 brotli==1.2.1
  grpcio==1.85.3 protobuf==6.33.6
  py-spy==0.4.3
)
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
  manylinux_2_5_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  platforms+=(--platform "$tag")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform any -d .whl "${WHEELS[@]}"
du -sh .whl
