#!/usr/bin/env bash
# Build llama.cpp's own measuring tools from the llama.cpp that llama-cpp-python vendors, so that
# lab/compare_llamacpp.py compares specli with exactly the llama.cpp it runs on.
#
#   lab/build_llama_tools.sh [--with-cli] [--with-server]
#
# Builds llama-bench, llama-lookup and llama-speculative-simple (CPU only, Release, the same ggml
# options llama-cpp-python's Linux build uses: GGML_NATIVE and OpenMP at their defaults) into
#   ${SPECLI_LLAMA_TOOLS:-$HOME/.cache/specli/llama-tools}/bin
# --with-cli also builds llama-cli (it links llama.cpp's server code: several more minutes).
# --with-server also builds llama-server (for `specli export --to llama-server` and
# `specli bench --server`; several more minutes on 2 cores).
#
# Environment:
#   SPECLI_LLAMA_TOOLS   cache directory (source, build tree, bin/)
#   SPECLI_LLAMA_SRC     an unpacked llama.cpp tree to build instead (default: the llama-cpp-python
#                        sdist of the installed version, fetched once with `pip download`)
#   SPECLI_LLAMA_VERSION llama-cpp-python version whose sdist to use (default: the installed one)
#   PYTHON               the Python whose llama-cpp-python to match (default: python3)
#   JOBS                 parallel compile jobs (default: 2)
# A previous build is reused: nothing is compiled again when the binaries are there and the
# source version and target list are the same (CMake rebuilds only what changed otherwise).
set -euo pipefail

with_cli=0
with_server=0
for arg in "$@"; do
    case "$arg" in
        --with-cli) with_cli=1 ;;
        --with-server) with_server=1 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "build_llama_tools.sh: error: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

python="${PYTHON:-python3}"
cache="${SPECLI_LLAMA_TOOLS:-$HOME/.cache/specli/llama-tools}"
jobs="${JOBS:-2}"
targets=(llama-bench llama-lookup llama-speculative-simple)
[ "$with_cli" = 1 ] && targets+=(llama-cli)
[ "$with_server" = 1 ] && targets+=(llama-server)

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "build_llama_tools.sh: error: $tool not found (apt-get install build-essential cmake)" >&2; exit 1; }
done

if [ -n "${SPECLI_LLAMA_SRC:-}" ]; then
    src="$SPECLI_LLAMA_SRC"
    version="custom:$(cd "$src" && pwd)"
else
    version="${SPECLI_LLAMA_VERSION:-$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || echo 0.3.36)}"
    src="$cache/src/llama_cpp_python-$version/vendor/llama.cpp"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        mkdir -p "$cache/src"
        echo "fetching the llama-cpp-python $version source distribution (pip download)" >&2
        "$python" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache/src" >&2
        tar -xzf "$cache/src/llama_cpp_python-$version.tar.gz" -C "$cache/src"
    fi
fi
[ -f "$src/CMakeLists.txt" ] || { echo "build_llama_tools.sh: error: no llama.cpp tree at $src" >&2; exit 1; }

bin="$cache/bin"
stamp="$bin/.built-from"
want="$version ${targets[*]}"
all_there=1
for t in "${targets[@]}"; do [ -x "$bin/$t" ] || all_there=0; done
if [ "$all_there" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "llama.cpp tools already built ($version): $bin"
    exit 0
fi

build="$cache/build-$(echo "$version" | tr '/:' '__')"
server=OFF
[ "$with_cli" = 1 ] && server=ON
[ "$with_server" = 1 ] && server=ON
# Static libraries: the binaries in bin/ then run from anywhere without an rpath into the build tree.
cmake -S "$src" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER="$server" \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DGGML_METAL=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF >&2
cmake --build "$build" --config Release -j "$jobs" --target "${targets[@]}" >&2

mkdir -p "$bin"
for t in "${targets[@]}"; do
    cp -f "$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)" "$bin/$t"
done
echo "$want" > "$stamp"
echo "built ${targets[*]} ($version) into $bin"
