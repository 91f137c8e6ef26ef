"""Load a target/draft pair, stream a generation's events, print the stats.

python examples/stream_api.py TARGET.gguf DRAFT.gguf "Once upon a time"
"""

from __future__ import annotations

import sys

from specli import GenerationParams, RoundEvent, SamplingParams, TokenEvent, load

COLOURS = {"accepted": "\033[32m", "corrected": "\033[33m", "bonus": "\033[36m", "plain": ""}


def main() -> None:
    target, draft, prompt = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "Once upon a time"
    params = GenerationParams(max_tokens=64, sampling=SamplingParams(temperature=0.0), draft_max=4)
    with load(target, draft, n_ctx=1024) as spec:
        rounds = 0
        generation = spec.generate(prompt, params)
        for event in generation:
            if isinstance(event, TokenEvent):
                print(f"{COLOURS[event.origin.value]}{event.text}\033[0m", end="", flush=True)
            elif isinstance(event, RoundEvent):
                rounds += 1
        stats = generation.stats
        print()
        print(
            f"{stats.n_generated} tokens in {rounds} rounds, acceptance {stats.acceptance_rate or 0:.0%}, "
            f"{stats.tokens_per_second or 0:.1f} tokens/s"
        )
        for key, value in stats.as_dict().items():
            print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
