#!/usr/bin/env bash
# Does speculation pay on this machine? Bench the offline demo pair (built on first use, ~1 minute),
# then keep every figure in bench.json / bench.csv.
#
#   examples/bench_demo.sh [DIR]        DIR: where the demo pair lives (default: demo-models)
#
# For your own pair: specli bench --target T.gguf --draft D.gguf [--prompts my_prompts.jsonl]
# (a prompts file is one prompt per line, or JSONL objects {"name": ..., "prompt": ...}).
set -euo pipefail

dir="${1:-demo-models}"
specli demo-models "$dir"   # does nothing if the pair is already there

# Plain and speculative runs alternate on every prompt (same seed), so the speedup of each pair is
# measured under the same machine conditions. -k auto lets the policy pick k round by round.
specli bench \
    --target "$dir/specli-demo-target.gguf" \
    --draft "$dir/specli-demo-draft.gguf" \
    -k 1,2,4,auto \
    --temp 0,0.7 \
    -n 64 \
    --repeat 2 \
    --json bench.json \
    --csv bench.csv

echo "every run: bench.csv (one row per run); everything: bench.json"
