#!/usr/bin/env bash
# specli on a lent NVIDIA GPU, in one call: build llama.cpp with CUDA from the vendored tree, check that
# specli loads (and if not, which of its differences from a plain llama_cpp.Llama load crashes), write
# the models on the device, then time specli against llama-bench, llama-speculative-simple and
# llama-server side by side. Everything goes to $OUT/report.txt (and JSON beside it), which comes back
# even when the call runs out of time: each stage checks the budget first.
#
# On this machine first:   bash lab/device_pack.sh           (writes .device/: the source, wheels)
# Then one device call:    run(command="BUDGET=380 HARD=520 bash lab/device_check.sh", carry=[".device"],
#                              timeout_s=560)
# (BUDGET: no stage starts after it; HARD: none runs past it; FROM_SOURCE=1 builds on the device even
# with a prebuilt bundle: the build of the H200 crash, native to its processor.)
# A CPU dry run of the same stages (no CUDA, tools from a CPU build of the vendored tree):
#   CUDA=0 LLAMA_BUILD=/tmp/lcpu LLAMA_SRC=<llama-cpp-python sdist> N=16 REPEAT=1 BUDGET=1800 \
#       OUT=/tmp/out bash lab/device_check.sh
#
# Stages (each skipped when the budget is spent): the CUDA build of .device/prebuilt.tar.xz where it
# runs, else a build (one architecture, FlashAttention kernels off: 155 s on an H200's 16 cores, 286 s on an
# H100's) - the load check (lab/load_variants.py) - models: the 152k-vocabulary
# pair and a Gemma-3-270M-shaped 262k-vocabulary target (lab/build_large_vocab_pair.py), the demo pair
# (copies from its context: for n-gram lookup) - llama-bench tg128 of every model - plain decoding
# and draft-model speculation against llama-bench and llama-speculative-simple (lab/compare_llamacpp.py)
# - n-gram lookup against llama-server's types on the demo target (lab/compare_llama_server.py) -
# `specli bench` of the pair (the verify curve on the GPU, k 4/8/16/auto at T 0 and 0.7).
set -u
export PYTHONUNBUFFERED=1
R=$PWD
W=${WORK:-/tmp/w}
OUT=${OUT:-/tmp/out}
mkdir -p "$W" "$OUT"
T0=$(date +%s)
REPORT="$OUT/report.txt"
CUDA=${CUDA:-1}
NGL=$([ "$CUDA" = 1 ] && echo 99 || echo 0)
THREADS=${THREADS:-$([ "$CUDA" = 1 ] && echo 8 || echo 2)}
N=${N:-256}  # tokens per timed run (a CPU dry run: fewer)
REPEAT=${REPEAT:-3}

log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$REPORT"; }
left() { [ $(( $(date +%s) - T0 )) -lt "${BUDGET:-480}" ]; }
stage() {  # stage NAME SECONDS COMMAND...: run it with its output in the report, bounded in time
    local name=$1 seconds=$2; shift 2
    if ! left; then log "skipped (budget): $name"; return 1; fi
    # no stage runs past HARD seconds: the call's own limit must not cut the report
    local rest=$(( ${HARD:-100000} - ($(date +%s) - T0) ))
    [ "$seconds" -le "$rest" ] || seconds=$rest
    log "== $name"
    timeout "$seconds" "$@" >> "$REPORT" 2>&1
    local rc=$?
    [ $rc = 0 ] || log "$name: exit $rc"
    return $rc
}

log "specli device check, $(date -u +%F), commit $(git -C "$R" rev-parse --short HEAD 2>/dev/null || echo '?')"
if [ "$CUDA" = 1 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$REPORT"
fi
nproc | sed 's/^/cores: /' | tee -a "$REPORT"

# -- llama.cpp with CUDA, and llama-cpp-python's own Python package, from .device/ ----------------------
build_from_source() {
    L=$W/vendor/llama.cpp
    cuda_flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_CUDA_FA=OFF)
    [ "$CUDA" = 1 ] || cuda_flags=()
    cmake -S "$L" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g "${cuda_flags[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON \
        > "$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log" | tee -a "$REPORT"; exit 1; }
    cmake --build "$W/b" -j"$(nproc)" --target llama llama-bench llama-speculative-simple llama-server \
        > "$W/build.log" 2>&1 || { tail -40 "$W/build.log" | tee -a "$REPORT"; exit 1; }
    B=$W/b/bin
    LIB=$(dirname "$(find "$W/b" -name 'libllama.so' | head -1)")
    log "built from source"
}
if [ -n "${LLAMA_BUILD:-}" ]; then
    SRC=${LLAMA_SRC:-$(python3 -c "import llama_cpp, os; print(os.path.dirname(os.path.dirname(llama_cpp.__file__)))")}
else
    tar xJf .device/lcpp-src.tar.xz -C "$W"
    SRC=$W
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl >> "$REPORT" 2>&1
fi
# The checkout's specli and synth, llama-cpp-python's package, and llama.cpp's gguf-py (it writes the
# synthetic models: the device's Python has no gguf package)
export PYTHONPATH=$R:$R/synth:$SRC:$SRC/vendor/llama.cpp/gguf-py:/tmp/site:${PYTHONPATH:-}
M=$W/models
mkdir -p "$M"
python3 -c "from specli_synth.fixtures import build_fixture_models; build_fixture_models('$M/fixture')" \
    >> "$REPORT" 2>&1
if [ -n "${LLAMA_BUILD:-}" ]; then
    B=$LLAMA_BUILD/bin
    LIB=$(dirname "$(find "$LLAMA_BUILD" -name 'libllama.so' | head -1)")
elif [ -f .device/prebuilt.tar.xz ] && [ "${FROM_SOURCE:-0}" != 1 ]; then
    # Built on a development machine (lab/build_cuda_here.sh, lab/device_pack.sh): the CUDA libraries
    # (sm_90), a portable CPU backend and the tools, beside this machine's CUDA runtime and cuBLAS; if
    # they do not run here, build.
    mkdir -p "$W/pre" && tar xJf .device/prebuilt.tar.xz -C "$W/pre"
    cuda_libs=$(python3 - <<'PY'
import glob, os, site
roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"]
for sp in site.getsitepackages():
    roots += glob.glob(os.path.join(sp, "nvidia", "*", "lib")) + glob.glob(os.path.join(sp, "nvidia", "*", "*", "lib"))
found = []
for name in ("libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"):
    for r in roots:
        if os.path.exists(os.path.join(r, name)):
            found.append(r)
            break
print(":".join(dict.fromkeys(found)))
PY
)
    export LD_LIBRARY_PATH=$W/pre/lib:$cuda_libs:$W/pre/lib/cudart:${LD_LIBRARY_PATH:-}
    log "prebuilt: CUDA libraries from ${cuda_libs:-nowhere}"
    if ldd "$W/pre/lib/libggml-cuda.so" | grep -q "not found" \
        || ! timeout 60 "$W/pre/lib/llama-bench" -m "$M/fixture/fixture-target.gguf" -ngl "$NGL" -p 0 -n 8 \
            -r 1 >> "$REPORT" 2>&1; then
        ldd "$W/pre/lib/libggml-cuda.so" | grep "not found" | tee -a "$REPORT"
        log "the prebuilt libraries do not run here: building"
        build_from_source
    else
        ln -sfn lib "$W/pre/bin"  # lab/_bench_common.tools_dir() looks in bin/
        B=$W/pre/bin
        LIB=$W/pre/lib
        log "prebuilt libraries run"
    fi
else
    build_from_source
fi
export LLAMA_CPP_LIB_PATH=$LIB
export SPECLI_LAB_GPU_LAYERS=$NGL
export SPECLI_LLAMA_TOOLS=${B%/bin}  # lab/_bench_common.tools_dir() adds bin/
# specli from the checkout (nothing is installed there); an array, so that `timeout` can run it
specli=(python3 -X faulthandler -c "import sys; from specli.launcher import main; sys.argv[0] = 'specli'; main()")

# -- does specli load on this build? -------------------------------------------------------------------
if "${specli[@]}" run --target "$M/fixture/fixture-target.gguf" --no-draft -n 8 -ngl "$NGL" "Once upon a time" \
        >> "$REPORT" 2>&1; then
    log "specli loads and generates on this build"
else
    log "specli run failed (exit $?): which difference from llama_cpp.Llama crashes"
    stage "load variants" 200 python3 lab/load_variants.py "$M/fixture/fixture-target.gguf" \
        --gpu-layers "$NGL"
    if command -v cuda-gdb > /dev/null; then
        stage "native backtrace of specli run" 150 cuda-gdb -batch -ex run -ex bt --args python3 -c \
            "import sys; from specli.launcher import main; sys.argv = ['specli', 'run', '--target', '$M/fixture/fixture-target.gguf', '--no-draft', '-n', '8', '-ngl', '$NGL', 'Once upon a time']; main()"
    fi
    [ "${GO_ON_AFTER_CRASH:-0}" = 1 ] || { log "stopped: specli does not load (GO_ON_AFTER_CRASH=1 measures anyway)"; exit 1; }
fi

# -- models ------------------------------------------------------------------------------------------
stage "the 152k pair" 150 python3 lab/build_large_vocab_pair.py "$M"
stage "the Gemma-shaped 262k target" 150 python3 lab/build_large_vocab_pair.py "$M" --shape gemma3
stage "the demo pair" 150 "${specli[@]}" demo-models "$M/demo"
T=$M/large-vocab-target.gguf
D=$M/large-vocab-draft.gguf
G=$M/gemma-shaped-target.gguf
ls -la "$M" >> "$REPORT"

# -- llama-bench: every model, tg128 and pp512 ---------------------------------------------------------
models=()
for m in "$T" "$D" "$G" "$M/demo/specli-demo-target.gguf"; do [ -f "$m" ] && models+=(-m "$m"); done
stage "llama-bench" 120 "$B/llama-bench" "${models[@]}" -ngl "$NGL" -t "$THREADS" -p 512 -n 128 -r 3 -o md

# -- plain decoding and the draft model against llama-bench and llama-speculative-simple -----------------
stage "plain and draft-model speculation vs llama-bench and llama-speculative-simple" 260 \
    python3 lab/compare_llamacpp.py --no-gemma --model "$T" --model "$G" --target "$T" --draft "$D" \
    --only plain,draft -n "$N" --repeat "$REPEAT" -t "$THREADS" -k 8 --tool-k 4,8,16 --draft-temp 0 \
    --draft-temp 0.7 -c 4096 --tools "$B" --json "$OUT/compare_llamacpp.json"

# -- n-gram lookup against llama-server's types, on a model that copies from its context ----------------
stage "n-gram lookup vs llama-server (demo target, copy-edit and code)" 240 \
    python3 lab/compare_llama_server.py --target "$M/demo/specli-demo-target.gguf" --prompt copy-edit \
    --prompt code --temp 0 --defaults-only -n "$N" --repeat "$REPEAT" -t "$THREADS" --settle 0.5 \
    --json "$OUT/compare_llama_server.json"

# -- the verify curve on this device, and -k auto against fixed k --------------------------------------
stage "specli bench (verify curve; k 4, 8, 16, auto; T 0 and 0.7)" 200 \
    "${specli[@]}" bench --target "$T" --draft "$D" -ngl "$NGL" -t "$THREADS" -k 4,8,16,auto --temp 0,0.7 \
    -n "$(( N / 2 ))" --repeat 1 --json "$OUT/bench.json"

cp "$W"/build.log "$W"/cmake.log "$OUT/" 2>/dev/null
log "done"
