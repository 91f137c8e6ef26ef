"""Replay n-gram lookup's draft policy over recorded texts, without noise: a change to the policy or
the drafter judged on the same texts in seconds instead of a benchmark's minutes of lottery.

    python lab/replay_ngram.py record --target T.gguf --prompt copy-edit --temp 0.8 \\
        --seed 1000 --count 60 [-n 256] --out texts.json
    python lab/replay_ngram.py replay texts.json [--root DIR ...] [--carry] [--oracle] [--branches]
        [--ngram-simple] [--json F]

Why it is exact: with a seed and same-as-plain verification (specli's default), the tokens a
generation commits do not depend on what was drafted, only on the seed (docs/exactness.md). So a
recorded text is what any policy would have produced, and a replay only has to ask the policy what
it drafts each round, compare that with the text, and charge the round its cost: the recording's
measured verify curve (CostModel medians at the round's position, the same for every policy), plus
the lookup's own time as it runs here. Each text starts a fresh policy, as each `specli run` is a new
process (`--carry` keeps what the policy learned from one text to the next, as one process would).

`--root DIR` (repeatable) replays with the specli tree at DIR, each in its own process, and prints
per-text ratios against the first; without it the installed specli. `--oracle` adds a policy that
knows the text: each round it drafts exactly the lookup's tokens that will be accepted (none where
a plain round is cheaper). It chooses round by round, so it is a ceiling for what the lookup offers
in practice, not a strict one (a policy that drafts fewer, cheaper rounds can beat it on a text).
`--branches` asks what a draft tree of two branches could win: where a draft failed, was the
lookup's runner-up the text's token, and in a plain round its first or second candidate; each hit
is priced at the round it could save, each extra row at the verify curve (`_BranchTally`).
`--ngram-simple` adds llama-server's ngram-simple rule replayed the same way (`simple_draft`).

Not modelled: sampling's own time (the same per committed token whatever the policy, ~2 % of a
round here), bursts of machine load, and Gemma 3 270M Q4_K_M's texts forking with the batch layout
(a recorded text is its recording's; a real run of another policy forks from it after a while).
Measured claims still come from interleaved runs (ab_revisions.py, compare_llama_server.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_revisions import ALL_PROMPTS  # noqa: E402


def record(opts: argparse.Namespace) -> None:
    from specli.api import load
    from specli.engine import GenerationParams
    from specli.settings import RunSettings

    texts = []
    with load(opts.target, "ngram", n_ctx=opts.ctx, n_threads=opts.threads) as spec:
        prompt = spec.tokenize(ALL_PROMPTS[opts.prompt])
        for seed in range(opts.seed, opts.seed + opts.count):
            settings = RunSettings(max_tokens=opts.n, temp=opts.temp, seed=seed, ignore_eos=True,
                                   threads=opts.threads, ctx=opts.ctx)
            generation = spec.generate(prompt, GenerationParams.of(settings))
            generation.complete()
            stats = generation.stats.as_dict()
            texts.append({"seed": seed, "tokens": list(generation.tokens), "tps": stats["tokens_per_second"]})
            print(f"seed {seed}: {stats['tokens_per_second']:.1f} tok/s", flush=True)
        costs = spec.engine.costs.to_record()
    Path(opts.out).write_text(json.dumps({"prompt_name": opts.prompt, "prompt": prompt, "temp": opts.temp,
                                          "n": opts.n, "texts": texts, "costs": costs}))


def replay_texts(recording: dict, carry: bool, oracle: bool, branches: bool = False) -> list[dict]:
    """Each text replayed: simulated tok/s, rounds, drafted and rejected rows; with `branches`, what
    a second branch of the draft tree could have won (`_BranchTally`)."""
    from specli.costs import CostModel
    from specli.drafters.base import Draft
    from specli.drafters.ngram import NGramDrafter
    from specli.drafters.registry import NGRAM_LOOKUP
    from specli.engine import GenerationParams
    from specli.policy import HORIZON, Learned, regime
    from specli.proposer import RoundResult, make_proposer
    from specli.sampling import Noise, Sampler
    from specli.settings import RunSettings
    from specli.verify import Verdict

    prompt, n = recording["prompt"], recording["n"]
    measured = CostModel()
    measured.restore(recording["costs"])
    params = GenerationParams.of(RunSettings(max_tokens=n, temp=recording["temp"], ignore_eos=True))
    costs = learned = None
    results = []
    for text in recording["texts"]:
        if costs is None or not carry:  # a new process: the cost file's costs, nothing learned
            costs, learned = CostModel(), Learned()
            costs.restore(recording["costs"])
        full = [*prompt, *text["tokens"]]
        learned.enter(regime(params.sampling, True))
        drafter = NGramDrafter(NGRAM_LOOKUP.name)
        proposer = make_proposer(drafter, "auto", costs, learned)
        context = list(prompt)
        proposer.begin(context, Sampler(params.sampling, Noise(text["seed"]), True))
        emitted, seconds, rounds, drafted, rejected = 0, 0.0, 0, 0, 0
        tally = _BranchTally()
        while emitted < n:
            limit = n - emitted - 1
            started = time.perf_counter()
            position = len(context) - 1  # tokens in the target's cache before the round
            curve = measured.verify_seconds(HORIZON, position)
            if oracle:
                proposal = drafter.lookup(context, min(limit, HORIZON - 1)) if limit else []
                right = _agreeing(proposal, full, len(context))
                while right and curve[measured.cheapest_batch(right + 1, HORIZON, position) - 1] >= (
                        right + 1) * curve[0]:
                    right -= 1  # a plain round is cheaper
                draft = Draft(proposal[:right], None, drafter.name, [1.0] * right)
            else:
                draft = proposer.propose(context, limit, left=n - emitted)
            draft_seconds = time.perf_counter() - started
            batch = 1 + len(draft.tokens)
            # Padded to a cheaper batch as the engine does: by what the policy has learned, or for
            # the oracle by the measured costs.
            padded = (measured.cheapest_batch(batch, HORIZON, position) if oracle
                      else proposer.batch_size(batch, HORIZON))
            padding = padded - batch
            verify_seconds = curve[padded - 1]
            accepted = _agreeing(draft.tokens, full, len(context))
            if branches and limit:
                tally.add(drafter, full, context, draft.tokens, accepted, curve, padded,
                          measured.cheapest_batch(min(padded + 1, HORIZON), HORIZON, position))
            committed = [*draft.tokens[:accepted], full[len(context) + accepted]]
            context.extend(committed)
            if not oracle:
                verdict = Verdict(committed, accepted, [None] * len(committed))
                proposer.observe(RoundResult(context, draft, verdict, draft_seconds, verify_seconds, padding))
            emitted += len(committed)
            seconds += draft_seconds + verify_seconds
            rounds += 1
            drafted += len(draft.tokens)
            rejected += len(draft.tokens) - accepted
        results.append(_text_result(text, emitted, seconds, rounds, drafted, rejected,
                                    **(vars(tally) if branches else {})))
    return results


def _text_result(text: dict, emitted: int, seconds: float, rounds: int, drafted: int, rejected: int,
                 **extra: float) -> dict:
    """One replayed text's record (replay_texts, replay_simple)."""
    return {"seed": text["seed"], "tps": emitted / seconds, "seconds": seconds, "recorded_tps": text["tps"],
            "rounds": rounds, "drafted": drafted, "rejected": rejected, **extra}


class _BranchTally:
    """What verifying a second branch could win, against its cost: at the position where a draft was
    rejected, the lookup's runner-up (the next most followed token among the long copy's occurrences
    or the longest n-gram's counts); in a plain round, its first and second candidates as two rows.
    A hit saves at most a round's fixed part (the next round drafts the rest anyway), so `fork_bound`
    (a branch verified only where it hits, at no cost) is a ceiling; `fork_cost` is one more row in
    every drafted round, `fork0_gain` what such a row at the first position wins. In plain rounds
    the first candidate alone is what the policy declined to draft; `plain_gain` counts either."""

    def __init__(self) -> None:
        self.fork_hits = self.plain_first_hits = self.plain_second_hits = 0
        self.fork_bound = self.fork_cost = self.fork0_gain = self.plain_cost = self.plain_gain = 0.0

    def add(self, drafter, full: list[int], context: list[int], tokens: list[int], accepted: int,
            curve: list[float], padded: int, padded_one_more: int) -> None:
        seq = [*context, *tokens[:accepted]]
        actual, ranked = full[len(seq)], _candidates(drafter, seq)
        if not tokens:
            self.plain_cost += curve[2] - curve[0]
            self.plain_first_hits += ranked[:1] == [actual]
            self.plain_second_hits += ranked[1:2] == [actual]
            self.plain_gain += curve[0] if actual in ranked[:2] else 0.0
            return
        self.fork_cost += curve[padded_one_more - 1] - curve[padded - 1]
        if accepted < len(tokens) and next((t for t in ranked if t != tokens[accepted]), None) == actual:
            self.fork_hits += 1
            self.fork_bound += curve[0]
            self.fork0_gain += curve[0] if accepted == 0 else 0.0


def _candidates(drafter, seq: list[int]) -> list[int]:
    """The lookup's candidates for the token after `seq`, most followed first: the long copy's
    occurrences' votes, then each n-gram's counts from the longest n down (its indexes as they stand;
    nothing new is counted)."""
    ranked: list[int] = []
    followers, _ = drafter._occurrences(seq)
    votes: dict[int, list[int]] = {}
    for pos in followers:
        votes.setdefault(seq[pos], []).append(pos)
    by_votes = sorted(votes.items(), key=lambda item: (len(item[1]), item[1][-1]), reverse=True)
    ranked += [t for t, _ in by_votes]
    for n in range(min(drafter.n_max, len(seq)), drafter.n_min - 1, -1):
        seen = drafter._follow[n].get(tuple(seq[-n:]), {})
        ranked += [t for t, _ in sorted(seen.items(), key=lambda item: tuple(item[1]), reverse=True)]
    return list(dict.fromkeys(ranked))


def simple_draft(tokens: list[int], size_n: int = 12, size_m: int = 48) -> list[int]:
    """What llama-server's ngram-simple drafts after `tokens` (llama.cpp common/ngram-map.cpp,
    common_ngram_simple_draft, at its defaults): the tokens that followed the latest earlier
    occurrence of the last size_n tokens, at most size_m of them and nothing if fewer than size_n."""
    end = len(tokens)
    if end <= size_n + size_m + 1:
        return []
    pattern = tokens[end - size_n :]
    for start in range(end - size_n - 1, 0, -1):
        if tokens[start : start + size_n] == pattern:
            follow = tokens[start + size_n : start + size_n + size_m]
            return follow if len(follow) >= size_n else []
    return []


def replay_simple(recording: dict) -> list[dict]:
    """ngram-simple's rule over each recorded text, each round charged as replay_texts charges it
    (the recording's verify curve, no padding: the server does not pad, plus the lookup's time)."""
    from specli.costs import CostModel
    from specli.policy import HORIZON

    prompt, n = recording["prompt"], recording["n"]
    measured = CostModel()
    measured.restore(recording["costs"])
    results = []
    for text in recording["texts"]:
        full = [*prompt, *text["tokens"]]
        context = list(prompt)
        emitted, seconds, rounds, drafted, rejected = 0, 0.0, 0, 0, 0
        while emitted < n:
            curve = measured.verify_seconds(HORIZON, len(context) - 1)
            started = time.perf_counter()
            draft = simple_draft(context)[: min(n - emitted - 1, HORIZON - 1)]
            seconds += time.perf_counter() - started + curve[len(draft)]
            accepted = _agreeing(draft, full, len(context))
            context.extend([*draft[:accepted], full[len(context) + accepted]])
            emitted += accepted + 1
            rounds += 1
            drafted += len(draft)
            rejected += len(draft) - accepted
        results.append(_text_result(text, emitted, seconds, rounds, drafted, rejected))
    return results


def _agreeing(proposal: list[int], full: list[int], at: int) -> int:
    """How many of `proposal` the text has at `at` onwards."""
    n = 0
    while n < len(proposal) and at + n < len(full) and proposal[n] == full[at + n]:
        n += 1
    return n


# A replay with another tree's specli: this file's functions, that tree's package first on sys.path.
_RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[2])
import replay_ngram
recording = json.load(open(sys.argv[3]))
print(json.dumps(replay_ngram.replay_texts(recording, sys.argv[4] == "1", False, sys.argv[5] == "1")))
"""


def replay(opts: argparse.Namespace) -> None:
    recording = json.loads(Path(opts.texts).read_text())
    runs: dict[str, list[dict]] = {}
    if opts.root:
        here = str(Path(__file__).resolve().parent)
        for i, root in enumerate(opts.root):
            flags = ["1" if opts.carry else "0", "1" if opts.branches else "0"]
            proc = subprocess.run([sys.executable, "-c", _RUNNER, str(Path(root).resolve()), here, opts.texts,
                                   *flags], capture_output=True, text=True, timeout=3600)
            if proc.returncode:
                raise SystemExit(f"{root}: {proc.stderr.strip()[-500:]}")
            label = root if root not in runs else f"{root} ({i + 1})"
            runs[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        runs["specli"] = replay_texts(recording, opts.carry, False, opts.branches)
    if opts.oracle:
        runs["oracle"] = replay_texts(recording, opts.carry, True)
    if opts.ngram_simple:
        runs["ngram-simple rule"] = replay_simple(recording)
    first = next(iter(runs.values()))
    print(f"{recording['prompt_name']} T {recording['temp']:g}, {len(recording['texts'])} texts "
          f"(recorded median {statistics.median(t['tps'] for t in recording['texts']):.1f} tok/s)")
    for label, results in runs.items():
        total = sum(r["rounds"] for r in results)
        line = (f"{label:>24}: median {statistics.median(r['tps'] for r in results):6.1f} tok/s, "
                f"{total} rounds, {sum(r['rejected'] for r in results)} of "
                f"{sum(r['drafted'] for r in results)} drafted rejected")
        if results is not first:
            ratios = [r["tps"] / f["tps"] for r, f in zip(results, first, strict=True)]
            line += f"; per text / first: median {statistics.median(ratios):.3f}"
        print(line)
        if opts.branches and label not in ("oracle", "ngram-simple rule"):
            print(_branch_line(results))
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(runs, indent=2))


def _branch_line(results: list[dict]) -> str:
    """A second branch's figures summed over the texts, as shares of their replayed time."""
    total = sum(r["seconds"] for r in results)

    def sum_of(key: str) -> float:
        return sum(r[key] for r in results)

    return (f"{'':>24}  a second branch: runner-up right where {sum_of('fork_hits'):.0f} drafts failed, "
            f"ceiling {sum_of('fork_bound') / total:.1%} of the time; one more row in every drafted round "
            f"costs {sum_of('fork_cost') / total:.1%}, wins {sum_of('fork0_gain') / total:.1%} at the first "
            f"position; in plain rounds the first candidate was right {sum_of('plain_first_hits'):.0f} "
            f"times, the second {sum_of('plain_second_hits'):.0f}: both as two rows cost "
            f"{sum_of('plain_cost') / total:.1%}, win at most {sum_of('plain_gain') / total:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = ap.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="generate texts with specli's defaults and keep them")
    rec.add_argument("--target", required=True)
    rec.add_argument("--prompt", required=True, choices=sorted(ALL_PROMPTS))
    rec.add_argument("--temp", type=float, default=0.8)
    rec.add_argument("--seed", type=int, default=1000, help="the first text's seed (then +1 each)")
    rec.add_argument("--count", type=int, default=20)
    rec.add_argument("-n", type=int, default=256)
    rec.add_argument("-t", "--threads", type=int, default=2)
    rec.add_argument("-c", "--ctx", type=int, default=4096)
    rec.add_argument("--out", required=True)
    rep = commands.add_parser("replay", help="replay the policy over recorded texts")
    rep.add_argument("texts")
    rep.add_argument("--root", action="append", help="a specli tree to replay with (repeatable)")
    rep.add_argument("--carry", action="store_true", help="one policy across the texts, as one process")
    rep.add_argument("--oracle", action="store_true", help="also a policy that knows the text")
    rep.add_argument("--branches", action="store_true",
                     help="also what verifying a second candidate (a two-branch tree) could win")
    rep.add_argument("--ngram-simple", action="store_true",
                     help="also llama-server's ngram-simple rule, replayed over the same texts")
    rep.add_argument("--json", dest="json_path")
    opts = ap.parse_args()
    record(opts) if opts.command == "record" else replay(opts)


if __name__ == "__main__":
    main()
