#!/usr/bin/env bash
# specli on a lent NVIDIA GPU, in one call: build llama.cpp with CUDA from the vendored tree, check that
# specli loads (and if not, which of its differences from a plain llama_cpp.Llama load crashes), write
# the models on the device, then time specli against llama-bench, llama-speculative-simple and
# llama-server side by side. Everything goes to $OUT/report.txt (and JSON beside it), which comes back
# even when the call runs out of time: each stage checks the budget first.
#
# On this machine first:   bash lab/device_pack.sh           (writes .device/: the source, wheels)
# Then one device call:    run(command="BUDGET=470 HARD=560 bash lab/device_check.sh", carry=[".device"],
#                              timeout_s=590)
# (BUDGET: no stage starts after it; HARD: none runs past it; FROM_SOURCE=1 builds on the device even
# with a prebuilt bundle: the build of the H200 crash, native to its processor; STAGES=a,b runs only
# those stages, by the names of their `want` lines: a second call on the warm machine, within its 30 s
# of idling, reuses the first's unpacked bundle and models and runs what the first had no time for;
# DFLASH2=1 also writes DFlash2's bench set, minutes of numpy, for its stage.)
# A CPU dry run of the same stages (no CUDA, tools from a CPU build of the vendored tree):
#   CUDA=0 LLAMA_BUILD=/tmp/lcpu LLAMA_SRC=<llama-cpp-python sdist> N=16 REPEAT=1 BUDGET=1800 \
#       OUT=/tmp/out bash lab/device_check.sh
#
# Stages, in the order of what matters most (each skipped when the budget is spent): the CUDA build of
# .device/prebuilt.tar.xz where it runs, else a build (one architecture, FlashAttention kernels off: 155 s
# on an H200's 16 cores, 286 s on an H100's; 209 s for libllama alone on an H200 on 2026-11-28) - the
# load check (lab/load_variants.py) - models, written here by three processes at once (83 s): the
# 152k-vocabulary pair and a Gemma-3-270M-shaped 262k-vocabulary target (lab/build_large_vocab_pair.py),
# synth's trained-drafter bench set (a 152k target with EAGLE-3, DFlash and DSpark heads, structured and
# random), synth's Gemma 4 bench set (a 262k target and its assistants) - llama-bench tg128 of every
# target - -k auto with a random head against the target alone (lab/head_auto_check.py, #48) - plain
# decoding against llama-bench and llama-server with the filters in the graph and on the host in the
# same repetitions (lab/host_work.py --paths, #51) - a draft step of each drafter against llama.cpp's and
# the time outside llama_decode (lab/host_work.py) - each structured head against
# llama-speculative-simple --spec-type of its kind (lab/compare_llamacpp.py, #48) - the Gemma 4
# assistant against llama-speculative-simple --spec-type draft-mtp, and a random one under -k auto -
# the features' share of the target's decode (lab/feature_tax.py) and a declined head resting at once
# (head_auto_check.py --rest) - `specli bench` of the pair (the verify curve, k 4/8/auto at T 0 and
# 0.7) - with NATIVE_CHECK=1 /
# FROM_SOURCE_CHECK=1, the H200 load crash's two checks of 2026-11-28. The JSON of every stage comes back
# in $OUT/json.tar.gz. The first run of these stages (2026-11-28, H200): lab/runs/2026-11-28-h200.txt.
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
    # a cost cache of its own: one written by an earlier stage (or while the machine was busy) would
    # change what -k auto does in this one
    SPECLI_CACHE_DIR=$(mktemp -d "$W/cache.XXXX") timeout "$seconds" "$@" >> "$REPORT" 2>&1
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
    B_FROM_SOURCE=1
    log "built from source"
}
if [ -n "${LLAMA_BUILD:-}" ]; then
    SRC=${LLAMA_SRC:-$(python3 -c "import llama_cpp, os; print(os.path.dirname(os.path.dirname(llama_cpp.__file__)))")}
else
    [ -d "$W/vendor/llama.cpp" ] || tar xJf .device/lcpp-src.tar.xz -C "$W"
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
    [ -f "$W/pre/lib/libllama.so" ] || { mkdir -p "$W/pre" && tar xJf .device/prebuilt.tar.xz -C "$W/pre"; }
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

# -- models, written here (1.5 GB does not travel): one Python process per writer, at once. A second call
# on the same warm machine finds them written (and the bundle unpacked) and goes straight to its stages.
if [ -f "$M/.written" ]; then
    log "models: written by an earlier call on this machine"
elif left; then
    log "== models: the 152k pair, the Gemma-shaped 262k target, the trained-drafter bench set"
    writers=()
    timeout 200 python3 lab/build_large_vocab_pair.py "$M" > "$W/models-pair.log" 2>&1 & writers+=($!)
    timeout 200 python3 lab/build_large_vocab_pair.py "$M" --shape gemma3 > "$W/models-gemma.log" 2>&1 &
    writers+=($!)
    timeout 200 python3 -m specli_synth trained-drafters "$M/td" --size bench --kinds eagle3,dflash,dspark \
        > "$W/models-td.log" 2>&1 & writers+=($!)
    # A Gemma 4 target (262k vocabulary) and its assistants (~18 s and 2.4 GB on the development machine)
    timeout 200 python3 -m specli_synth gemma4 "$M/g4" --size bench > "$W/models-g4.log" 2>&1 & writers+=($!)
    # DFlash2's head covers the whole vocabulary (~270 MB each; 850 s on the 2-core development machine
    # while it compiled, unfinished after 480 s on the H200 of the second run, where its numpy threads
    # loaded the machine under every stage): only with DFLASH2=1, and waited for like the others.
    if [ "${DFLASH2:-0}" = 1 ]; then
        timeout 900 python3 -m specli_synth trained-drafters "$M/td2" --size bench --kinds dflash2 \
            > "$W/models-td2.log" 2>&1 & writers+=($!)
    fi
    wait "${writers[@]}"
    cat "$W"/models-*.log >> "$REPORT"
    touch "$M/.written"
fi
T=$M/large-vocab-target.gguf
D=$M/large-vocab-draft.gguf
G=$M/gemma-shaped-target.gguf
TD=$M/td
ls -la "$M" "$TD" >> "$REPORT" 2>&1
J=$W/json
mkdir -p "$J"

# STAGES (a comma list of the names below; empty: all, in this order, the most wanted first) picks
# what a call runs, so that a second call on the warm machine runs what the first had no time for.
want() { [ -z "${STAGES:-}" ] || [[ ",$STAGES," == *",$1,"* ]]; }

# -- llama-bench: every model, tg128 and pp512 ---------------------------------------------------------
models=()
for m in "$T" "$D" "$G" "$TD/target.gguf" "$M/g4/gemma4-target.gguf"; do [ -f "$m" ] && models+=(-m "$m"); done
want llama-bench && stage "llama-bench" 120 "$B/llama-bench" "${models[@]}" -ngl "$NGL" -t "$THREADS" -p 512 \
    -n 128 -r 3 -o md

# -- #48: what a declined random head costs against the target alone (0.78-0.87x on the H200 of
# 2026-11-28, before its catch-up was waited for and its features priced) ---------------------------------
want auto && stage "-k auto with random heads vs the target alone (#48)" 120 \
    python3 lab/head_auto_check.py "$TD" --prompts short --repeat "$REPEAT" -t "$THREADS" -n "$N" \
    --generations 2

# -- #51: plain decoding vs llama-bench and llama-server, the filters in the graph and on the host in the
# same repetitions (on the H200 of 2026-11-28 specli's decode cost ~0.2 ms a token more than
# llama-bench's with the filters in the graph: greedy rows were a top-k 1, which ggml's CUDA sorts the
# whole row for; they are llama.cpp's greedy sampler, an argmax, since) ---------------------------------
want plain && stage "plain decoding, the filters in the graph and on the host" 200 \
    python3 lab/host_work.py --plain "$T" --plain "$D" --plain "$G" -n $(( 2 * N )) --repeat "$REPEAT" \
    -t "$THREADS" -c 4096 --tools "$B" --paths graph,host --json "$J/host_work-plain.json"

# -- #51: where plain decoding's gap to llama-bench lies (0.82x on the 262k target at T 0 in the second
# H200 run): llama-bench's loop and llama.cpp's greedy sampler on specli's own context, beside specli ----
for m in "$G" "$T"; do
    want baseline && stage "decode baseline on $(basename "$m") (llama.cpp's loop on specli's context)" 60 \
        python3 lab/decode_baseline.py "$m" -n "$N" --repeat 5 -t "$THREADS" -c 4096
done

# -- #51: a draft step of each drafter against llama.cpp's; the time outside llama_decode ----------------
g4=()
[ -f "$M/g4/gemma4-assistant.gguf" ] && g4=(--gemma4 "$M/g4")
want steps && stage "draft steps vs llama-speculative-simple" 150 \
    python3 lab/host_work.py --pair "$T" "$D" --trained "$TD" "${g4[@]}" --draft-n $(( N / 2 )) --repeat "$REPEAT" \
    -t "$THREADS" -k 8 -c 4096 --tools "$B" --json "$J/host_work-steps.json"

# -- #48: the trained drafters against llama-speculative-simple --spec-type of their kind ----------------
for head in eagle3 dflash dspark dflash2; do
    want "$head" || continue
    set_dir=$TD
    [ "$head" = dflash2 ] && set_dir=$M/td2
    [ -f "$set_dir/$head.gguf" ] || { log "no $head.gguf (not written: DFLASH2=1 writes it): skipped"; continue; }
    stage "$head (structured) vs llama-speculative-simple --spec-type of its kind (code prompt, T 0 and 0.7)" \
        90 python3 lab/compare_llamacpp.py --no-gemma --only draft --target "$set_dir/target.gguf" \
        --draft "$set_dir/$head.gguf" -k "${HEAD_K:-4}" --tool-k "${HEAD_TOOL_K:-2,4}" --draft-temp 0 \
        --draft-temp 0.7 --draft-prompt code -n "$N" --repeat "$REPEAT" -t "$THREADS" -c 4096 --tools "$B" \
        --json "$J/trained-$head.json"
done

# -- #48: Gemma 4's assistant against llama-speculative-simple --spec-type draft-mtp, and -k auto with a
# random one against the target alone ---------------------------------------------------------------------
if [ -f "$M/g4/gemma4-assistant.gguf" ]; then
    want assistant && stage "Gemma 4 assistant (structured) vs llama-speculative-simple --spec-type draft-mtp (code prompt, T 0 and 0.7)" \
        90 python3 lab/compare_llamacpp.py --no-gemma --only draft --target "$M/g4/gemma4-target.gguf" \
        --draft "$M/g4/gemma4-assistant.gguf" -k "${HEAD_K:-4}" --tool-k "${HEAD_TOOL_K:-2,4}" --draft-temp 0 \
        --draft-temp 0.7 --draft-prompt code -n "$N" --repeat "$REPEAT" -t "$THREADS" -c 4096 --tools "$B" \
        --json "$J/trained-assistant.json"
    want assistant-auto && stage "-k auto with a random Gemma 4 assistant vs the target alone" 60 \
        python3 lab/head_auto_check.py "$M/g4" --target gemma4-target.gguf --heads gemma4-assistant-random \
        --prompts short --repeat "$REPEAT" -t "$THREADS" -n "$N" --generations 2
else
    log "no gemma4-assistant.gguf (its writer failed): the assistant's stages skipped"
fi

# -- #48: the features' share of the target's decode; a declined head resting at once ---------------------
want tax && stage "the features' cost in the target's decode" 60 \
    python3 lab/feature_tax.py "$TD/target.gguf" "$TD/eagle3-random.gguf" "$TD/dflash-random.gguf" \
    "$TD/dspark-random.gguf" -n 128 --repeat 5 -t "$THREADS"
want rest && stage "-k auto with random heads that rest once declined (an experiment)" 120 \
    python3 lab/head_auto_check.py "$TD" --prompts short --repeat "$REPEAT" -t "$THREADS" -n "$N" \
    --generations 2 --rest

# -- -k auto against fixed k on this device's verify curve ----------------------------------------------
want specli-bench && stage "specli bench (verify curve; k 4, 8, auto; T 0 and 0.7)" 90 \
    "${specli[@]}" bench --target "$T" --draft "$D" -ngl "$NGL" -t "$THREADS" -k 4,8,auto --temp 0,0.7 \
    -n "$(( N / 2 ))" --repeat 1 --json "$J/bench.json"

# -- the H200 load crash (NATIVE_CHECK=1, FROM_SOURCE_CHECK=1): on 2026-11-28 the carried bundle ran with
# that machine's native CPU backend, and a build from source there crashed in llama_model_load_from_file
# with either CPU backend (lab/runs/2026-11-28-h200.txt) --------------------------------------------------
native_cpu() {
    grep -m1 "model name" /proc/cpuinfo
    grep -o -w -E "amx[a-z0-9_]*|avx512[a-z0-9_]*" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    cmake -S "$SRC/vendor/llama.cpp" -B "$W/native" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g \
        -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        > "$W/native-cmake.log" 2>&1 || { tail -20 "$W/native-cmake.log"; return 1; }
    cmake --build "$W/native" --target ggml-cpu -j"$(nproc)" > "$W/native-build.log" 2>&1 \
        || { tail -20 "$W/native-build.log"; return 1; }
    mkdir -p "$W/native-lib" && cp -a "$W"/native/bin/libggml-cpu.so* "$W/native-lib/"
    for model in "$M/fixture/fixture-target.gguf" "$T"; do
        LD_LIBRARY_PATH=$W/native-lib:${LD_LIBRARY_PATH:-} timeout 60 "${specli[@]}" run --target "$model" \
            --no-draft -n 16 -ngl "$NGL" --json "Once upon a time" 2>&1 | tail -c 600
        echo "specli run, native CPU backend, $(basename "$model"): exit ${PIPESTATUS[0]}"
    done
}
if [ "${NATIVE_CHECK:-0}" = 1 ] && left; then
    log "== native CPU backend (the H200 load crash)"
    native_cpu >> "$REPORT" 2>&1  # a function: timeout cannot run it, its commands are bounded instead
fi

if [ "${FROM_SOURCE_CHECK:-0}" = 1 ] && [ "$CUDA" = 1 ] && [ -z "${B_FROM_SOURCE:-}" ] && [ $(( ${HARD:-100000} - ($(date +%s) - T0) )) -gt 220 ] && left; then
    log "== the CUDA build from source, native (the H200 crash's build)"
    ( build_from_source ) >> "$REPORT" 2>&1
    lib=$(dirname "$(find "$W/b" -name 'libllama.so' | head -1)")
    LLAMA_CPP_LIB_PATH=$lib LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-} timeout 60 "${specli[@]}" run \
        --target "$M/fixture/fixture-target.gguf" --no-draft -n 8 -ngl "$NGL" "Once upon a time" >> "$REPORT" 2>&1
    log "specli run on the native build from source: exit $?"
fi


tar czf "$OUT/json.tar.gz" -C "$J" . 2>/dev/null
cp "$W"/build.log "$W"/cmake.log "$OUT/" 2>/dev/null
log "done"
