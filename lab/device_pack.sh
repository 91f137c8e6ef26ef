#!/usr/bin/env bash
# What a lent GPU machine needs for lab/device_check.sh, packed on this machine (the device reaches no
# package registry): the llama.cpp that llama-cpp-python 0.3.36 vendors, without docs, models, tests and
# the backends a CUDA build does not use (~7 MB), with llama-cpp-python's own Python package beside it,
# and the wheels specli needs there that its Python lacks (diskcache, imported by llama_cpp). Writes
# .device/ (ignored by git); name it in the device call's `carry`.
#
#   bash lab/device_pack.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" llama-cpp-python==0.3.36
tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
src="$tmp/llama_cpp_python-0.3.36"
L=vendor/llama.cpp
excludes=()
for part in docs tests benches media models; do excludes+=("--exclude=$L/$part"); done
for backend in blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
    excludes+=("--exclude=$L/ggml/src/ggml-$backend")
done
tar cJf "$out/lcpp-src.tar.xz" -C "$src" "${excludes[@]}" "$L" llama_cpp
rm -rf "$out/whl" && mkdir -p "$out/whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d "$out/whl" diskcache
du -sh "$out"/* "$out"/whl/*
