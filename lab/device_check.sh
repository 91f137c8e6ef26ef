#!/usr/bin/env bash
# specli on a lent NVIDIA GPU, in one call: build llama.cpp with CUDA from the vendored tree, check that
# specli loads (and if not, which of its differences from a plain llama_cpp.Llama load crashes), write
# the models on the device, then time specli against llama-bench, llama-speculative-simple and
# llama-server side by side. Everything goes to $OUT/report.txt (and JSON beside it), which comes back
# even when the call runs out of time: each stage checks the budget first.
#
# On this machine first:   bash lab/device_pack.sh           (writes .device/: the source, wheels)
# Then one device call:    run(command="BUDGET=500 bash lab/device_check.sh", carry=[".device"],
#                              timeout_s=590)
# A CPU dry run of the same stages (no CUDA, tools from a CPU build of the vendored tree):
#   CUDA=0 LLAMA_BUILD=/tmp/lcpu LLAMA_SRC=<llama-cpp-python sdist> N=16 REPEAT=1 BUDGET=1800 \
#       OUT=/tmp/out bash lab/device_check.sh
#
# Stages (each skipped when the budget is spent): build (~155 s on 16 cores, one architecture,
# FlashAttention kernels off) - the load check (lab/load_variants.py) - models: the 152k-vocabulary
# pair and a Gemma-3-270M-shaped 262k-vocabulary target (lab/build_large_vocab_pair.py), the demo pair
# (copies from its context: for n-gram lookup) - llama-bench tg128 of every model - plain decoding
# and draft-model speculation against llama-bench and llama-speculative-simple (lab/compare_llamacpp.py)
# - `specli bench` of the pair (the verify curve on the GPU, k 4/8/16/auto at T 0 and 0.7) - n-gram
# lookup against llama-server's types on the demo target (lab/compare_llama_server.py).
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
if [ -n "${LLAMA_BUILD:-}" ]; then
    B=$LLAMA_BUILD/bin
    LIB=$(dirname "$(find "$LLAMA_BUILD" -name 'libllama.so' | head -1)")
    SRC=${LLAMA_SRC:-$(python3 -c "import llama_cpp, os; print(os.path.dirname(os.path.dirname(llama_cpp.__file__)))")}
else
    tar xJf .device/lcpp-src.tar.xz -C "$W"
    L=$W/vendor/llama.cpp
    SRC=$W
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/whl/*.whl >> "$REPORT" 2>&1
    cuda_flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_CUDA_FA=OFF)
    [ "$CUDA" = 1 ] || cuda_flags=()
    cmake -S "$L" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g "${cuda_flags[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON \
        > "$W/cmake.log" 2>&1 || { tail -30 "$W/cmake.log" | tee -a "$REPORT"; exit 1; }
    cmake --build "$W/b" -j"$(nproc)" --target llama llama-bench llama-speculative-simple llama-server \
        > "$W/build.log" 2>&1 || { tail -40 "$W/build.log" | tee -a "$REPORT"; exit 1; }
    B=$W/b/bin
    LIB=$(dirname "$(find "$W/b" -name 'libllama.so' | head -1)")
    log "built"
fi
export LLAMA_CPP_LIB_PATH=$LIB
export PYTHONPATH=$R:$R/synth:$SRC:/tmp/site:${PYTHONPATH:-}
export SPECLI_LAB_GPU_LAYERS=$NGL
export SPECLI_LLAMA_TOOLS=${B%/bin}  # lab/_bench_common.tools_dir() adds bin/
specli() { python3 -X faulthandler -c "import sys; from specli.launcher import main; sys.argv[0] = 'specli'; main()" "$@"; }

# -- does specli load on this build? -------------------------------------------------------------------
M=$W/models
mkdir -p "$M"
python3 -c "from specli_synth.fixtures import build_fixture_models; build_fixture_models('$M/fixture')" \
    >> "$REPORT" 2>&1
if specli run --target "$M/fixture/fixture-target.gguf" --no-draft -n 8 -ngl "$NGL" "Once upon a time" \
        >> "$REPORT" 2>&1; then
    log "specli loads and generates on this build"
else
    log "specli run failed (exit $?): which difference from llama_cpp.Llama crashes"
    stage "load variants" 200 python3 lab/load_variants.py "$M/fixture/fixture-target.gguf" \
        --gpu-layers "$NGL"
fi

# -- models ------------------------------------------------------------------------------------------
stage "the 152k pair" 150 python3 lab/build_large_vocab_pair.py "$M"
stage "the Gemma-shaped 262k target" 150 python3 lab/build_large_vocab_pair.py "$M" --shape gemma3
stage "the demo pair" 150 specli demo-models "$M/demo"
T=$M/large-vocab-target.gguf
D=$M/large-vocab-draft.gguf
G=$M/gemma-shaped-target.gguf
ls -la "$M" >> "$REPORT"

# -- llama-bench: every model, tg128 and pp512 ---------------------------------------------------------
models=()
for m in "$T" "$D" "$G" "$M/demo/specli-demo-target.gguf"; do [ -f "$m" ] && models+=(-m "$m"); done
stage "llama-bench" 120 "$B/llama-bench" "${models[@]}" -ngl "$NGL" -t "$THREADS" -p 512 -n 128 -r 3 -o md

# -- plain decoding and the draft model against llama.cpp's tools ---------------------------------------
stage "plain and draft-model speculation vs llama-bench and llama-speculative-simple" 240 \
    python3 lab/compare_llamacpp.py --no-gemma --model "$G" --target "$T" --draft "$D" --only plain,draft \
    -n "$N" --repeat "$REPEAT" -t "$THREADS" -k 8 -c 4096 --tools "$B" --json "$OUT/compare_llamacpp.json"
for k in 4 16; do
    stage "llama-speculative-simple n-max $k (T 0 and 0.7)" 60 bash -c "
        for temp in 0 0.7; do
            $B/llama-speculative-simple -m $T -md $D --spec-type draft-simple -ngl $NGL -ngld $NGL \
                -t $THREADS -p 'def main(args):' -n $N --temp \$temp --spec-draft-n-max $k -s 1 \
                --ignore-eos 2>&1 | grep -E 'decoded|accept' | sed \"s/^/T \$temp: /\"
        done"
done

# -- the verify curve on this device, and -k auto against fixed k --------------------------------------
stage "specli bench (verify curve; k 4, 8, 16, auto; T 0 and 0.7)" 200 \
    specli bench --target "$T" --draft "$D" -ngl "$NGL" -t "$THREADS" -k 4,8,16,auto --temp 0,0.7 \
    -n "$(( N / 2 ))" --repeat "$REPEAT" --json "$OUT/bench.json"

# -- n-gram lookup against llama-server's types, on a model that copies from its context ----------------
stage "n-gram lookup vs llama-server (demo target, copy-edit and code)" 240 \
    python3 lab/compare_llama_server.py --target "$M/demo/specli-demo-target.gguf" --prompt copy-edit \
    --prompt code --temp 0 --defaults-only -n "$N" --repeat "$REPEAT" -t "$THREADS" --settle 0.5 \
    --json "$OUT/compare_llama_server.json"

cp "$W"/build.log "$W"/cmake.log "$OUT/" 2>/dev/null
log "done"
