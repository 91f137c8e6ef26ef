#!/usr/bin/env bash
# What a lent GPU machine needs for lab/device_check.sh, packed on this machine (the device reaches no
# package registry): the llama.cpp that llama-cpp-python 0.3.36 vendors, without docs, models, tests and
# the backends a CUDA build does not use (~7 MB), with llama-cpp-python's own Python package beside it,
# and the wheels specli needs there that its Python lacks (diskcache, imported by llama_cpp; starlette and
# uvicorn, for specli serve). Writes
# .device/ (ignored by git); name it in the device call's `carry`.
#
#   bash lab/device_pack.sh [DIR]
#
# A CUDA build made on a development machine saves the device 155-290 s of building: with PREBUILT_CUDA
# (the bin/ of a -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=ON build of the same
# tree; lab/build_cuda_here.sh makes one without a GPU, 36 min on 2 cores), PREBUILT_CPU (the bin/ of a
# -DGGML_NATIVE=OFF -DGGML_AVX2=ON build: a CPU backend that runs on any x86-64-v3 processor, which a
# native build on another vendor's processor may not) and PREBUILT_TOOLS (the bin/ of a build with
# llama-bench, llama-speculative-simple and llama-server, lab/build_llama_tools.sh --with-server), it also
# writes DIR/prebuilt.tar.xz; lab/device_check.sh uses it where it runs there and builds otherwise.
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
    --platform manylinux2014_x86_64 --platform any -d "$out/whl" diskcache starlette uvicorn
if [ -n "${PREBUILT_CUDA:-}" ]; then
    pre="$tmp/pre/lib"
    mkdir -p "$pre/cudart"
    cp -a "$PREBUILT_CUDA"/libggml-cuda.so* "$PREBUILT_CUDA"/libggml-base.so* "$PREBUILT_CUDA"/libggml.so* \
        "$PREBUILT_CUDA"/libllama.so* "$pre/"
    cp -a "$PREBUILT_CPU"/libggml-cpu.so* "$pre/"
    cp -a "$PREBUILT_TOOLS"/llama-bench "$PREBUILT_TOOLS"/llama-speculative-simple "$PREBUILT_TOOLS"/llama-server \
        "$PREBUILT_TOOLS"/libllama-bench-impl.so "$PREBUILT_TOOLS"/libllama-server-impl.so \
        "$PREBUILT_TOOLS"/libllama-common.so* "$PREBUILT_TOOLS"/libmtmd.so* "$pre/"
    cudart=$(ldd "$PREBUILT_CUDA/libggml-cuda.so" | awk '/libcudart.so/ {print $3}')
    [ -n "$cudart" ] && cp -L "$cudart" "$pre/cudart/"
    # libllama keeps its debug information: a crash's backtrace names the lines
    find "$pre" -maxdepth 1 -type f ! -name 'libllama.so*' -exec strip --strip-debug {} +
    tar cf - -C "$tmp/pre" lib | xz -T0 -6 > "$out/prebuilt.tar.xz"
fi
du -sh "$out"/* "$out"/whl/*
