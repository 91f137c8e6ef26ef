"""`specli serve` through the `openai` package: a streamed chat reply coloured by where each token came
from, then the server's figures for it.

    specli serve --target TARGET.gguf --draft DRAFT.gguf        # in another terminal
    python examples/openai_client.py "Write a haiku about the sea" [--url http://127.0.0.1:8080/v1]

Each chunk carries two fields OpenAI's clients ignore: `origin` (accepted, corrected, bonus, plain) and
`drafter`; the last chunk carries llama-server's `timings` and specli's `speculation`.
"""

from __future__ import annotations

import argparse

from openai import OpenAI

COLOURS = {"accepted": "\033[32m", "corrected": "\033[33m", "bonus": "\033[36m", "plain": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message", nargs="?", default="Once upon a time")
    parser.add_argument("--url", default="http://127.0.0.1:8080/v1", help="the server's API base URL")
    parser.add_argument("--key", default="unused", help="the server's --api-key, if it has one")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    args = parser.parse_args()

    client = OpenAI(base_url=args.url, api_key=args.key)
    stream = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": args.message}], max_tokens=args.max_tokens,
        seed=1, stream=True, stream_options={"include_usage": True})
    last = None
    for chunk in stream:
        extra = chunk.model_extra or {}
        if chunk.choices and chunk.choices[0].delta.content:
            colour = COLOURS.get(extra.get("origin", "plain"), "")
            print(f"{colour}{chunk.choices[0].delta.content}\033[0m", end="", flush=True)
        last = chunk
    print()
    figures = (last.model_extra or {}) if last is not None else {}
    timings, speculation = figures.get("timings", {}), figures.get("speculation", {})
    print(f"{timings.get('predicted_n')} tokens at {timings.get('predicted_per_second')} tokens/s; "
          f"prompt {timings.get('prompt_n')} evaluated, {timings.get('cache_n')} from the cache")
    if speculation.get("drafted"):
        print(f"drafter {speculation['drafter']}: {speculation['accepted']} of {speculation['drafted']} "
              f"drafted tokens accepted; predicted speedup {speculation.get('predicted_speedup')}")


if __name__ == "__main__":
    main()
