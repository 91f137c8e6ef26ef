"""specli's n-gram drafting against one llama-server type on the very same sampled texts.

    python lab/compare_same_text.py [--target T.gguf] [--type ngram-simple] [--prompt copy-edit]
        [--temp 0.8] [-n 256] [--repeat 20] [--seed 1000] [--settle 2] [--json out.json]

At a temperature above 0 each side of compare_llama_server.py samples its own text with its own
random numbers, and a text that copies its prompt runs several times faster than one that does not:
the median of per-pair ratios then mostly measures which texts each side drew (Gemma 3 270M's
copy-edit at T 0.8: 0.94, 1.10, 1.12 and 1.01 in four runs of the same code). A set of seeds can
also tilt one side: on copy-edit the server's first token was one the model gives 0.36 (and that
copies the most) in 60 of 120 texts (seeds 1000-1019, 2000-2019, 3000-3039, 4000-4039), because the
first uniform of std::mt19937 falls below 0.36 at half of those seeds (at 35.8 % over seeds
0-19999); specli's keyed noise drew it in 36.

Here each repetition asks a fresh llama-server (`--type`, at its defaults) for a text, then runs
specli in a fresh process on the same prompt with `specli run`'s defaults and its random numbers
replaced by a script of that text: every draw lands on the server's token at its position (the
scripted id's Gumbel noise raised far above every other's), so specli drafts, verifies, samples and
commits exactly as it does on its own texts, with real llama.cpp decodes and its own timing, on the
server's text. The rows specli computes differ from the server's in the last bits (other batches),
so where the scripted token falls just outside specli's filtered support (a min-p or top-p cut)
specli commits its own best token there and the texts part (often for good: the script's later
tokens may not fit specli's context). Such texts are counted, and the figures are given over all
texts and over the identical ones alone. Rates, both over the whole generation with the prompt excluded:
the server's timings.predicted_per_second, specli's GenerationStats tokens/s. The server runs first
in every repetition (its text is the script); each side is a fresh process after the same pause.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_llama_server import (  # noqa: E402
    NGRAM_CONFIGS,
    PROMPTS,
    Server,
    add_run_arguments,
    server_and_target,
    specli_tokens,
)

# Run first in specli's fresh process (compare_llama_server.specli_tokens), with `extra` the text:
# the engine draws every token it commits through Dist.draw with the noise keyed at the token's
# position, so raising the scripted id's Gumbel noise there makes specli commit the text.
_SCRIPTED_NOISE = """
import numpy as np
import specli.engine
from specli.sampling import Noise

script = {len(ids) + j: token for j, token in enumerate(extra)}

class ScriptedNoise(Noise):
    def gumbel_few(self, position, ids, family, salt=0):
        want = script.get(position)
        return [1e9 if i == want else 0.0 for i in ids]

    def gumbel(self, position, ids, family, salt=0):
        return np.where(ids == script.get(position, -1), 1e9, 0.0)

    def block_gumbel(self, *args, **kwargs):
        raise SystemExit("scripted noise needs a filtered support (top-k)")

    gumbel_blocked = block_gumbel

specli.engine.Noise = ScriptedNoise
"""


def specli_on_text(target: str, ids: list[int], text: list[int], temp: float, seed: int, threads: int,
                   ctx: int) -> dict:
    """specli's defaults (n-gram drafting, -k auto, same-as-plain) in a fresh process, committing `text`."""
    return specli_tokens(target, "ngram", ids, len(text), temp, seed, threads, ctx, _SCRIPTED_NOISE, text)


def differing(a: list[int], b: list[int]) -> int:
    """At how many positions two texts of the same length differ."""
    return sum(x != y for x, y in zip(a, b, strict=True))


def summary(pairs: list[dict], server: str) -> str:
    """Medians, the median and spread of per-text ratios, and the ratio over all texts."""
    ratios = [p["specli"]["tps"] / p["server"]["tps"] for p in pairs]
    theirs = [p["server"]["tps"] for p in pairs]
    mine = [p["specli"]["tps"] for p in pairs]
    return (f"median {server} {statistics.median(theirs):.1f}, specli {statistics.median(mine):.1f} tok/s; "
            f"per text specli / {server}: median {statistics.median(ratios):.2f} (geometric mean "
            f"{statistics.geometric_mean(ratios):.2f}, {min(ratios):.2f}-{max(ratios):.2f}); over all "
            f"texts {statistics.harmonic_mean(mine) / statistics.harmonic_mean(theirs):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--type", default="ngram-simple", choices=[label for label, _ in NGRAM_CONFIGS])
    ap.add_argument("--prompt", default="copy-edit", choices=sorted(PROMPTS))
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    add_run_arguments(ap)
    opts = ap.parse_args()
    if not opts.temp > 0:
        raise SystemExit("--temp must be above 0 (at 0 both sides already produce the same text)")
    binary, target = server_and_target(opts.target)
    flags = dict(NGRAM_CONFIGS)[opts.type]
    server = Server(binary, target, opts.type, flags, opts.threads, opts.ctx)
    prompt = PROMPTS[opts.prompt]
    # The prompt's ids as the server tokenizes it (BOS first): specli gets the same ids.
    ids = llama_cpp.Llama(model_path=target, vocab_only=True, verbose=False).tokenize(
        prompt.encode(), add_bos=True, special=True)
    pairs = []
    try:
        for rep in range(opts.repeat):
            seed = opts.seed + rep
            # The server always first: its text is specli's script. Each side is a fresh process
            # loading the same GGUF from the page cache, after the same pause.
            time.sleep(opts.settle)
            server.start()
            time.sleep(opts.settle)
            try:
                got = server.complete(prompt, opts.n, opts.temp, seed)
            finally:
                server.stop()
            time.sleep(opts.settle)
            mine = specli_on_text(target, ids, got["tokens"], opts.temp, seed, opts.threads, opts.ctx)
            differ = differing(mine["tokens"], got["tokens"])
            pairs.append({"seed": seed, "server": got, "specli": mine, "differing": differ})
            print(f"seed {seed}: {opts.type} {got['tps']:.1f}, specli {mine['tps']:.1f} tok/s"
                  + (f" (texts differ in {differ} tokens)" if differ else ""), flush=True)
    finally:
        server.stop()
    identical = [p for p in pairs if not p["differing"]]
    print(f"{opts.prompt} T {opts.temp:g}, {len(pairs)} texts, {len(identical)} identical on both sides:")
    for label, runs in (("all texts", pairs), ("identical texts", identical)):
        if runs:
            print(f"   {label}: {summary(runs, opts.type)}")
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(pairs, indent=2))


if __name__ == "__main__":
    main()
