"""The n-gram drafter's lookup rules, on token lists (no model needed: lookup is pure bookkeeping)."""

from __future__ import annotations

import pytest

from specli.drafters.ngram import LONG_N, NGramDrafter
from specli.drafters.registry import NGRAM_LOOKUP
from specli.sampling import Noise, Sampler, SamplingParams


def drafter(context: list[int], **kw) -> NGramDrafter:
    d = NGramDrafter(NGRAM_LOOKUP.name, **kw)
    d.begin(context, Sampler(SamplingParams(temperature=0.0), Noise(0)))
    return d


def test_drafts_a_whole_period_of_repeating_text() -> None:
    """The last match of a periodic text is one period back: a copy of what followed it would stop
    at the end of the context after a token; drafting over its own proposals goes on."""
    context = [7, 1, 2, 3] * 4 + [7, 1]
    assert drafter(context).lookup(context, 8) == [2, 3, 7, 1, 2, 3, 7, 1]


def test_a_run_of_one_token_is_drafted_as_far_as_asked() -> None:
    context = [5, 6] + [9] * 6
    assert drafter(context).lookup(context, 12) == [9] * 12


def test_the_most_frequent_continuation_wins_not_the_most_recent() -> None:
    # After (1, 2, 3): 4 three times, 5 once (most recently).
    context = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 5, 0, 1, 2, 3]
    d = drafter(context)
    assert d.lookup(context, 1) == [4]
    assert d.last_match_len == 3  # (0, 1, 2, 3) is new: (1, 2, 3) is the longest n-gram seen before
    assert d.next_source(context) == "ngram"


def test_unconfident_short_matches_are_not_proposed() -> None:
    # A 1-gram seen once is not enough (at least 2 sightings for n = 1), and no longer n-gram matches.
    context = [1, 2, 3, 4, 5, 6, 3]
    d = drafter(context)
    assert d.lookup(context, 4) == []
    assert d.last_match_len == 0
    # Seen twice, always followed by the same token: proposed.
    context = [3, 9, 5, 3, 9, 6, 3]
    assert drafter(context).lookup(context, 1) == [9]


def test_a_split_continuation_below_the_share_is_not_proposed() -> None:
    # After 1: 2, 3, 4 once each (33 % each) -> no 1-gram proposal.
    context = [1, 2, 1, 3, 1, 4, 1]
    assert drafter(context).lookup(context, 2) == []


def test_counts_follow_the_growing_context_and_cached_lookups_agree() -> None:
    context = [1, 2, 3, 1, 2]
    d = drafter(context)
    assert d.lookup(context, 3) == []  # a 2-gram seen once is not enough (3- and 4-grams: once is)
    context += [3, 1, 2]
    assert d.lookup(context, 3) == [3, 1, 2]
    assert d.lookup(context, 1) == [3]  # the same context: reused
    context += [7, 5, 1, 2]
    assert d.lookup(context, 1) == [3]  # (5, 1, 2) is new; (1, 2) -> 3, 3, 7: the frequent one wins
    context += [7, 5, 1, 2]
    assert d.lookup(context, 1) == [7]  # (7, 5, 1, 2) seen once, followed by 7: the longest match


def test_a_fork_is_less_sure_than_a_single_sighting() -> None:
    """Confidence is the winner's lead over the runner-up: text that alternates between two
    continuations (2:1 so far) must not look as sure as a continuation seen once, or the calibration
    could not learn that forks fail."""
    once = [1, 2, 3, 4, 9, 1, 2, 3]
    fork = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 0, 1, 2, 3]  # after (1, 2, 3): 4, 5, 4
    tie = [8, 1, 2, 3, 4, 8, 1, 2, 3, 5, 8, 1, 2, 3]  # after (8, 1, 2, 3): 4, 5
    assert drafter(once).draft(once, 1).confidence == [0.5]
    forked = drafter(fork).draft(fork, 1)
    assert forked.tokens == [4] and forked.confidence == [0.25]
    tied = drafter(tie).draft(tie, 1)
    assert tied.tokens == [5] and tied.confidence == [0.0]  # the most recent, as sure as a coin


def test_the_prompt_is_counted_at_begin_and_later_tokens_billed_as_catch_up() -> None:
    """The prompt is counted when the generation begins, as the prompt's own work: billed to the first
    look, it priced a look with a whole prompt's counting (2 ms for 600 tokens), and auto spaced the
    shadows of a fast target hundreds of tokens apart. What was committed since the last lookup is a
    debt of those tokens, not a cost of the draft: auto would otherwise think lookups dear."""
    context = [7, 1, 2, 3] * 500
    d = drafter(context)
    prompt = d.index_seconds
    assert prompt > 0  # counted at begin
    first = d.draft(context, 4)
    assert first.tokens == [7, 1, 2, 3]
    assert first.catch_up_seconds == d.index_seconds - prompt  # none of the prompt's counting
    assert not first.first_in_catch_up  # the lookup itself is still this draft's cost
    counted = d.index_seconds
    second = d.draft([*context, 7, 1, 2, 3, 7], 4)
    # Only the counting since (five new tokens) is billed: exact bookkeeping, not a timing race.
    assert second.catch_up_seconds == d.index_seconds - counted > 0


# -- long copies: earlier occurrences of the last LONG_N tokens, followed as long as they agree --------


def test_a_long_match_picks_the_passage_being_copied_over_the_frequent_continuation() -> None:
    """(1, 2, 3, 4) is followed by 5 three times and by 9 once; the context is copying the passage
    where it was followed by 9, which a long match pinpoints, and it drafts that passage whole."""
    common = [1, 2, 3, 4, 5]
    passage = [*range(20, 20 + LONG_N), 1, 2, 3, 4, 9, 30, 31, 32, 33, 34, 35, 36]
    n = LONG_N + 4  # copied so far: the passage up to (1, 2, 3, 4)
    context = [*common, 50, *common, 51, *common, 52, *passage, 60, *passage[:n]]
    d = drafter(context)
    draft = d.draft(context, 8)
    assert draft.tokens == passage[n : n + 8]
    assert d.last_match_len == n
    # One occurrence: as sure as a single sighting, times the share 9 took after (1, 2, 3, 4) (one in
    # four), weighed by the match (LONG_N / n): where the short context forked before it is less sure.
    assert draft.confidence == pytest.approx([0.5 * 0.25 ** (LONG_N / n)] + [0.5] * 7)


def test_a_long_match_is_unsure_where_its_short_context_forked_before() -> None:
    """The counter of a repeated line: the last LONG_N tokens occurred once (followed by 5), but their
    last n_max tokens were followed by 5 once and by 6 once, so the copy's first token is half as
    sure as where they never forked; the longer the match, the less the fork weighs. The token is the
    long match's either way."""
    def first(context: list[int]) -> tuple[list[int], float]:
        draft = drafter(context).draft(context, 1)
        return draft.tokens, draft.confidence[0]

    tail = [100, 101, 102, 103]
    a, b = list(range(10, 10 + LONG_N - 4)), list(range(40, 40 + LONG_N - 4))
    assert first([*a, *tail, 5, *b, *tail, 6, 7, *a, *tail]) == ([5], 0.25)  # a LONG_N-token match
    assert first([*a, *tail, 5, *b, 104, 105, 106, 107, 6, 7, *a, *tail]) == ([5], 0.5)  # no fork
    longer = list(range(50, 50 + 2 * LONG_N - 4))  # a match of 2 LONG_N tokens
    tokens, sure = first([*longer, *tail, 5, *b, *tail, 6, 7, *longer, *tail])
    assert tokens == [5] and sure == pytest.approx(0.5 * 0.5 ** 0.5)


def test_a_long_copy_is_drafted_as_far_as_asked() -> None:
    passage = list(range(100, 180))
    context = [*passage, 7, *passage[:12]]
    assert drafter(context).lookup(context, 64) == passage[12:76]


def test_confidence_falls_where_the_copied_occurrences_fork() -> None:
    """Two earlier occurrences match as long and agree for three tokens, then part: the lead is 0 at
    the fork (the most recent wins), and only that occurrence is followed after it."""
    head = list(range(40, 52))
    first = [*head, 1, 2, 3, 70, 71, 72]
    second = [*head, 1, 2, 3, 80, 81, 82]
    context = [5, *first, 6, *second, 7, *head]
    draft = drafter(context).draft(context, 6)
    assert draft.tokens == [1, 2, 3, 80, 81, 82]
    assert draft.confidence == [2 / 3] * 3 + [0.0] + [0.5] * 2  # two agree, then part: one is followed
