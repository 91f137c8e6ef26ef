#!/usr/bin/env bash
# A CUDA build of the llama.cpp that llama-cpp-python 0.3.36 vendors, made on a development machine
# without a GPU (the CUDA 13 toolkit installed, no cuBLAS, no driver), for lab/device_pack.sh to carry
# to a lent GPU: there it saves ~290 s of building (an H100's 16 cores, 2026-11-27) out of 15 minutes.
# About 36 minutes on 2 cores (the CUDA kernels, one architecture: sm_90 for an H100/H200), plus a
# portable CPU backend (GGML_NATIVE=OFF with AVX2: a native one built on this processor may use
# instructions the device's lacks) in ~2 minutes.
#
#   bash lab/build_cuda_here.sh [DIR]        (default ~/.cache/specli/cuda-build; needs the registry)
#
# cuBLAS comes from the nvidia-cublas wheel, merged into a private copy of the toolkit; libcuda.so.1,
# which a build links for CUDA's virtual memory API, from a stub whose every entry point says "no
# device" (cuda_stub.c, written here). The libraries load here (no device found: the CPU runs) with
# LD_LIBRARY_PATH=DIR/stubrt:DIR/cuda/lib, which is how lab/device_check.sh's load check was tried here
# (the H200's crash did not reproduce: lab/history.md). Then:
#   PREBUILT_CUDA=DIR/build-cuda/bin PREBUILT_CPU=DIR/build-cpu/bin \
#       PREBUILT_TOOLS=~/.cache/specli/llama-tools/bin bash lab/device_pack.sh
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-$HOME/.cache/specli/cuda-build}
ARCH=${CUDA_ARCH:-90}
TOOLKIT=${CUDA_TOOLKIT:-/usr/local/cuda}
mkdir -p "$D" && cd "$D"
if [ ! -d src ]; then
    python3 -m pip download -q --no-deps --no-binary :all: -d sdist llama-cpp-python==0.3.36
    mkdir -p src && tar xzf sdist/llama_cpp_python-0.3.36.tar.gz -C src --strip-components=1
fi
L=$D/src/vendor/llama.cpp
if [ ! -x cuda/bin/nvcc ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d wheels "nvidia-cublas>=13,<14"
    rm -rf cublas && mkdir cublas && python3 -m zipfile -e wheels/nvidia_cublas-*.whl cublas
    cp -a "$(readlink -f "$TOOLKIT")" cuda.tmp
    cp -a cublas/nvidia/cu13/include/* cuda.tmp/include/ && cp -a cublas/nvidia/cu13/lib/* cuda.tmp/lib/
    (cd cuda.tmp/lib && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
    cat > cuda_stub.c <<'C'
/* libcuda.so.1 for linking and loading without a driver: every entry point reports
   CUDA_ERROR_NO_DEVICE (100). */
#define STUB(name) int name(void) { return 100; }
STUB(cuInit) STUB(cuDriverGetVersion) STUB(cuDeviceGet) STUB(cuDeviceGetCount)
STUB(cuDeviceGetAttribute) STUB(cuMemAddressFree) STUB(cuMemAddressReserve) STUB(cuMemCreate)
STUB(cuMemGetAllocationGranularity) STUB(cuMemMap) STUB(cuMemRelease) STUB(cuMemSetAccess)
STUB(cuMemUnmap) STUB(cuMemMap_v2) STUB(cuGetProcAddress) STUB(cuGetProcAddress_v2)
STUB(cuGetExportTable) STUB(cuCtxGetCurrent) STUB(cuDeviceGetName) STUB(cuDeviceTotalMem_v2)
int cuGetErrorString(int e, const char **s) { if (s) *s = "CUDA driver stub: no device"; return 0; }
int cuGetErrorName(int e, const char **s) { if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
C
    mkdir -p cuda.tmp/lib/stubs stubrt
    gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o cuda.tmp/lib/stubs/libcuda.so cuda_stub.c
    cp cuda.tmp/lib/stubs/libcuda.so stubrt/libcuda.so.1
    mv cuda.tmp cuda
fi
export PATH=$D/cuda/bin:$PATH
# -g on the C++ side: a crash's backtrace on the device names libllama's lines (device_pack.sh keeps it)
cmake -S "$L" -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_CUDA_FA=OFF -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_CUDA_COMPILER="$D/cuda/bin/nvcc" -DCUDAToolkit_ROOT="$D/cuda" -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF > cmake-cuda.log
time nice -n 19 cmake --build build-cuda --target llama -j"$(nproc)" > build-cuda.log
cmake -S "$L" -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF > cmake-cpu.log
nice -n 19 cmake --build build-cpu --target ggml-cpu -j"$(nproc)" > build-cpu.log
echo "built: $D/build-cuda/bin (CUDA, sm_$ARCH) and $D/build-cpu/bin (portable CPU backend)"
