"""How often llama.cpp's filters in the graph (backend sampling, float32) keep another set of ids than
specli's host filters (float64) on the same rows, and how often the keyed draw then differs.

    python lab/backend_filters_agree.py MODEL.gguf [MODEL2.gguf ...] [--tokens 2048] [--seed 0]

Per model: a text of --tokens tokens sampled plainly with the default settings (host filters), then
every position's row decoded twice in batches of 64 (the verify batches' shape): raw, filtered on the
host, and filtered in llama.cpp's graph, for several settings. Counts rows whose survivors differ,
rows whose survivors' logits differ, and rows where the keyed draw (seeds 0-3) gives another token.
Where they part: top-p's cumulative sum in float32 against float64 at the cut, min-p's threshold
(strict > in the graph, >= on the host; max + log(p) in float32), and ties at the k-th value (the
graph's heap order, the host's lowest id).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from specli import GenerationParams, load
from specli.llama import GraphFilters
from specli.sampling import DEFAULT_SAMPLING, Noise, SamplingParams, Survivors, distribution

SETTINGS = {
    "defaults (top-k 40, top-p 0.95, min-p 0.05)": DEFAULT_SAMPLING,
    "top-k 40, top-p 0.9": SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
    "top-k 100, min-p 0.1": SamplingParams(temperature=0.8, top_k=100, min_p=0.1),
    "top-k 20": SamplingParams(temperature=0.8, top_k=20),
}
BATCH = 64
# An edge float32 can cross: a cumulative mass this close to top-p (float32 sums ~40 terms of 2^-24
# relative error), or a logit this close to min-p's threshold (a few float32 ulps at logits of ~20).
NEAR = 1e-5


def edge_gap(row: np.ndarray, sampling: SamplingParams) -> float:
    """How close the row comes to an edge of the filters: the smallest relative distance of a
    cumulative top-k mass to top-p, or of a top-k logit to min-p's threshold (inf: neither filter)."""
    top = np.sort(row)[::-1][: sampling.top_k].astype(np.float64)
    m, gap = top[0], np.inf
    if sampling.top_p < 1.0:
        cum = np.cumsum(np.exp(top - m))
        gap = float(np.abs(cum / cum[-1] - sampling.top_p).min())
    if sampling.min_p > 0.0:
        gap = min(gap, float(np.abs(top - (m + np.log(sampling.min_p))).min() / max(1.0, abs(m))))
    return gap
PROMPT = "The history of the city begins"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    for path in args.models:
        with load(path, None, n_ctx=args.tokens + 64, n_threads=args.threads) as spec:
            model = spec.target
            prompt = spec.tokenize(PROMPT)
            params = GenerationParams(max_tokens=args.tokens, sampling=DEFAULT_SAMPLING, seed=args.seed,
                                      ignore_eos=True, draft_max=0, sampling_on="host")
            text = prompt + spec.generate(prompt, params).complete().tokens
            print(f"{Path(path).name}: vocabulary {model.n_vocab:,}, {len(text)} rows")
            for name, sampling in SETTINGS.items():
                filters, _ = GraphFilters.of(sampling, model.n_vocab)
                rows = sets = values = draws = near = 0
                closest = np.inf
                model.reset()
                for start in range(0, len(text) - 1, BATCH):
                    batch = text[start : start + BATCH]  # the cache holds text[:start]
                    raw = model.decode(batch, outputs="all").copy()
                    model.truncate(start)
                    model.set_filters(filters)
                    graph = model.decode_filtered(batch)
                    for i in range(len(batch)):
                        host = distribution(raw[i], sampling)
                        ids, logits = graph.survivors(i)
                        rows += 1
                        gap = edge_gap(raw[i], sampling)
                        closest = min(closest, gap)
                        near += gap < NEAR
                        if sorted(ids.tolist()) != sorted(host.ids.tolist()):
                            sets += 1
                        elif not np.array_equal(np.sort(logits), np.sort(raw[i][host.ids])):
                            values += 1
                        other = distribution(Survivors(ids, logits), sampling, width=model.n_vocab)
                        draws += any(other.draw(Noise(s), start + i) != host.draw(Noise(s), start + i)
                                     for s in range(4))
                    model.set_filters(None)
                print(f"  {name}: {rows} rows, survivors differ in {sets}, their logits in {values}, "
                      f"a keyed draw (seeds 0-3) in {draws}; {near} rows within {NEAR:g} of an edge "
                      f"(the closest {closest:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
