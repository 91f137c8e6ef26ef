"""Prompt-lookup decoding: propose what followed the context's last tokens before.

No draft model: the proposal is deterministic (a point mass), so the engine accepts a token with
probability p(x) and, on rejection, samples from p with x removed; greedy accepts while x is argmax.

Long copies first (as llama-server's ngram-mod): when the context's last LONG_N tokens occurred before,
the earlier occurrences are followed, token by token, for as long as they agree: a match of LONG_N
tokens pinpoints which earlier passage is being copied where a short n-gram is ambiguous ("of the" is
followed by many things). Confidence is the winning continuation's lead among the occurrences still
followed, as for the counts below; where they fork the lead falls, and the losers are dropped. It is
lower where the last n_max tokens were followed by other tokens before (a line's counter, code's
recurring method headers), the less so the longer the match. When no occurrence is left, counts take
over:

For each n (n_max down to n_min) the drafter counts which token followed every n-gram of the
prompt and output so far (updated incrementally as the context grows: O(n_max) per token). A draft
is built token by token: the longest n-gram ending the context *plus the tokens drafted so far* that
has a confident continuation gives the next token, the most frequent one (the most recent on a tie).
Iterating over its own proposals is what lets it draft through periodic text, where the last match
is one period back and a plain copy of what followed it would be cut off by the end of the context;
the counts are what keep one stray continuation from outvoting many (as llama.cpp's n-gram cache).
"""

from __future__ import annotations

import time

from specli.drafters.base import Draft, Drafter, DraftGate, HeldPosition, Source
from specli.sampling import Sampler

# A continuation of an n-gram is used when seen at least min_count times and taking at least min_share
# of what followed the n-gram: one (min_count, min_share) per order n = 1, 2 ..., the last also for
# longer orders (llama.cpp's lookup uses the same lax thresholds for its context cache).
_CONFIDENT = ((2, 0.66), (2, 0.5), (1, 0.5), (1, 0.5))
# The n-gram orders counted, longest first (what `specli export` tells other engines' prompt lookup):
# those the thresholds above are given for.
N_MAX, N_MIN = len(_CONFIDENT), 1
# Long copies: occurrences of the last LONG_N tokens are followed; a match is measured up to MAX_MATCH
# tokens back, and at most MAX_OCCURRENCES (the most recent) are followed. 12 (ngram-simple's pattern)
# rather than 8: fewer fresh matches of code's recurring lines (Gemma 3 270M, interleaved against 8:
# 1.01-1.11x on repetitive, copy-edit and code at T 0 and 0.8).
LONG_N = 12
MAX_MATCH = 64
MAX_OCCURRENCES = 16


class NGramDrafter(Drafter):
    """Prompt lookup over orders n_max down to n_min; `name`: its registry entry's."""

    def __init__(self, name: str, n_max: int = N_MAX, n_min: int = N_MIN) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.name = name
        self.sources = (Source(name, confidence_of_text=True),)
        self.n_max, self.n_min = n_max, n_min
        # _follow[n][ngram] = {next token: [count, last position seen]}
        self._follow: dict[int, dict[tuple[int, ...], dict[int, list[int]]]] = {}
        # _seen_at[the LONG_N tokens before a position] = the positions they preceded, oldest first
        self._seen_at: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # positions whose preceding n-grams are counted
        self.index_seconds = 0.0  # spent counting them
        self._billed = 0.0  # of that, reported as drafts' catch-up
        self.last_match_len = 0  # n behind the first token of the last lookup (0: none), for combined
        # The last lookup: (context length, k asked, proposal, n behind its first token, confidences).
        self._last: tuple[int, int, list[int], int, list[float]] | None = None

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._follow = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self._seen_at = {}
        self._indexed = 0
        self._last = None
        # The prompt is counted with the prompt, not billed to the first look as its catch-up: a look
        # priced with a whole prompt's counting (2 ms for 600 tokens here) spaced shadows hundreds of
        # tokens apart on a fast target.
        self._index(context)
        self._billed = self.index_seconds

    def _index(self, context: list[int]) -> None:
        # Count (n-gram -> next token) for every next token already committed.
        started = time.perf_counter()
        for pos in range(max(self._indexed, 1), len(context)):
            token = context[pos]
            for n in range(self.n_min, min(self.n_max, pos) + 1):
                seen = self._follow[n].setdefault(tuple(context[pos - n : pos]), {})
                entry = seen.get(token)
                if entry is None:
                    seen[token] = [1, pos]
                else:
                    entry[0] += 1
                    entry[1] = pos
            if pos >= LONG_N:
                self._seen_at.setdefault(tuple(context[pos - LONG_N : pos]), []).append(pos)
        self._indexed = len(context)
        self.index_seconds += time.perf_counter() - started

    def _occurrences(self, seq: list[int]) -> tuple[list[int], int]:
        """Where the text that ends `seq` occurred before: the positions that followed the (most recent)
        earlier occurrences of its last LONG_N tokens, and how far back the longest of them matches `seq`
        (0: none). Every occurrence votes: where they continue differently (the turn of a repeated
        line, a number that counts up), the lead is small, whichever matches longest."""
        if len(seq) < LONG_N:
            return [], 0
        found = self._seen_at.get(tuple(seq[-LONG_N:]))
        if not found:
            return [], 0
        followers = [pos for pos in found[-MAX_OCCURRENCES:] if pos < len(seq)]
        end, longest = len(seq), 0
        for pos in followers:
            m = LONG_N
            while m < MAX_MATCH and pos - m - 1 >= 0 and seq[pos - m - 1] == seq[end - m - 1]:
                m += 1
            longest = max(longest, m)
        return followers, longest

    @staticmethod
    def _follow_occurrences(seq: list[int], followers: list[int], match: int) -> tuple[int, float, list[int]]:
        """The next token of a long copy: what the followed occurrences continue with (the most
        recent on a tie), its confidence (its lead among them, shrunk towards 0 for few of them), and
        the occurrences that agree with it. As the counts' confidence: one sighting, however long its
        match, is not a sure thing (a line that repeats with a counter in it follows its one earlier
        occurrence up to the counter). Confidence from the match length alone (1 / (1 + LONG_N /
        match)) made such counters look sure and cost Gemma's repetitive prompt ~30 %."""
        votes: dict[int, list[int]] = {}
        for pos in followers:
            votes.setdefault(seq[pos], []).append(pos)
        token, agree = max(votes.items(), key=lambda item: (len(item[1]), item[1][-1]))
        runner_up = max((len(v) for t, v in votes.items() if t != token), default=0)
        return token, (len(agree) - runner_up) / (len(followers) + 1), agree

    def _share(self, seq: list[int], token: int) -> float:
        """The share `token` took of what followed the last n_max tokens of `seq` so far (1 if they
        were never seen): a short context that forked before (the counter of a repeated line, a
        method name after `def`) is where a short match often stops being copied."""
        seen = self._follow[self.n_max].get(tuple(seq[-self.n_max :]))
        if not seen:
            return 1.0
        total = sum(c for c, _ in seen.values())
        return seen[token][0] / total if token in seen else 0.0

    def _next(self, tail: list[int]) -> tuple[int, int, float] | None:
        """(token, n, confidence): the confident continuation of the longest n-gram ending `tail`,
        if any; confidence is its lead over the runner-up as a share of what followed, shrunk
        towards 0 for few sightings."""
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            seen = self._follow[n].get(tuple(tail[-n:]))
            if not seen:
                continue
            token, (count, _) = max(seen.items(), key=lambda item: item[1])  # count, then recency
            total = sum(c for c, _ in seen.values())
            min_count, min_share = _CONFIDENT[min(n, len(_CONFIDENT)) - 1]
            if count >= min_count and count >= min_share * total:
                # The winner's lead over the runner-up, not its share: a fork seen 2:1 (text that
                # alternates between two continuations) is much less sure than a single sighting,
                # and the calibration can only tell them apart if their confidences differ.
                runner_up = max((c for t, (c, _) in seen.items() if t != token), default=0)
                return token, n, (count - runner_up) / (total + 1)
        return None

    def _propose(self, context: list[int], k: int) -> tuple[list[int], list[float]]:
        """Up to k tokens, each the confident continuation of the context and the tokens before it,
        with their confidences."""
        last = self._last
        if last is not None and last[0] == len(context) and (k <= last[1] or len(last[2]) < last[1]):
            # The context only grows within a generation, so the same length is the same context as
            # the last call (next_source, then draft): reuse its proposal (if it was long enough, or
            # stopped on its own).
            self.last_match_len = last[3]
            return last[2][:k], last[4][:k]
        self._index(context)
        tail = context[-self.n_max :]
        proposal: list[int] = []
        confidence: list[float] = []
        first_n = 0
        # A long copy while earlier occurrences of the text agree (over the context and the tokens
        # proposed so far, so a periodic text is followed past the end of the context).
        seq = context
        followers, match = self._occurrences(seq)
        if followers:
            seq = list(context)  # grown with the proposal (a copy only where there is one: O(context))
        while followers and len(proposal) < k:
            token, sure, agree = self._follow_occurrences(seq, followers, match)
            # The short context's fork weighs less the longer the match: a passage copied for 40 tokens
            # goes on through a 4-gram it shares with other sentences, a fresh match of LONG_N tokens may not.
            sure *= self._share(seq, token) ** (LONG_N / max(match, LONG_N))
            first_n = first_n or match
            proposal.append(token)
            confidence.append(sure)
            seq.append(token)
            followers, match = [pos + 1 for pos in agree], match + 1
        if proposal:
            tail = seq[-self.n_max :]
        while len(proposal) < k:
            found = self._next(tail)
            if found is None:
                break
            token, n, sure = found
            first_n = first_n or n
            proposal.append(token)
            confidence.append(sure)
            tail = [*tail[1:], token] if len(tail) >= self.n_max else [*tail, token]
        self.last_match_len = first_n
        self._last = (len(context), k, proposal, first_n, confidence)
        return proposal, confidence

    def lookup(self, context: list[int], k: int) -> list[int]:
        """Up to k tokens, each the confident continuation of the context and the tokens before it."""
        return self._propose(context, k)[0]

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        """The proposal, stopped where the gate says a position no longer pays. Its confidence is a
        function of the context and the tokens drafted before it, never of a random draw, so a stop
        keeps sampling exact."""
        tokens, confidence = self._propose(context, k)
        held = None
        if gate is not None and tokens:
            # Looking ahead is free here, so the gate sees every position's confidence at once: a
            # doubtful position followed by sure ones (the turn of a repeated passage) is still
            # worth drafting through.
            n = gate.best_prefix(confidence)
            if n < len(tokens):
                held = HeldPosition(tokens[n], None, confidence[n])
                tokens, confidence = tokens[:n], confidence[:n]
        # Counting the tokens committed since the last lookup (the whole prompt, the first time) is
        # their debt, not this draft's cost: taken for a lookup's cost, it made lookups look dear
        # enough for auto to stop drafting.
        debt, self._billed = self.index_seconds - self._billed, self.index_seconds
        return Draft(tokens, None, self.name, confidence, held, debt)
