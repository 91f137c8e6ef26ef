"""DFlash and DSpark: trained block drafters that propose a whole block of tokens in one forward pass.

As llama.cpp's draft-dflash / draft-dspark (common/speculative.cpp): the target's features at each
committed position go into the drafter's KV cache (a projection per layer, no attention), then the
block [last token, <mask> ...] is decoded at once, every row a draft position:

* DFlash: the masks denoise in place: row i (i >= 1) is the token at the pending position + i.
* DSpark: anchor-first blocks (`dflash.sample_from_anchor`): row i is the token after position
  pending + i, a Markov head biases each row by the previous row's argmax (inside llama.cpp's graph),
  and a confidence head predicts each row's acceptance.
* DFlash2 (`dflash.selector_top_k`): DFlash's layout; inside the graph a selector keeps each row's
  top candidates and scores each pair of adjacent ones, and the draft is a path from the anchor on:
  greedy, the best-scoring successor of each position's choice (as llama.cpp's draft-dflash walks it);
  sampled, a choice drawn from the softmax of those scores over the candidates (its q).

The block's positions are dropped from the cache right after, so the cache holds the committed
positions' injected features only, as a fresh run's would. Each row's distribution is the head's own
(its logits under the run's sampling settings), and the tokens are drawn from them (keyed as the
target draws with same-as-plain), so the classic rule's q is exactly what was drawn from. The block
length is the round's k (at most the trained block); the gate then keeps the prefix that pays, from
every row's confidence at once.
"""

from __future__ import annotations

import time

import numpy as np

from specli.drafters.base import (
    CATCH_UP_TIMED,
    Draft,
    DraftGate,
    HeldPosition,
    Source,
    draft_filters,
    timed_catch_up,
)
from specli.drafters.head import HeadDrafter
from specli.heads import BlockContext, HeadModel
from specli.llama import Model
from specli.sampling import Dist, Sampler, Survivors, distribution, greedy_token, mask_banned, top_probability


class BlockDrafter(HeadDrafter):
    """Drafts with a DFlash or DSpark head (HeadModel, which it takes over) beside `target`; `name` is
    its registry entry's (DFlash's or DSpark's).

    p_min: drafts stop at the first row whose confidence falls below it (DSpark's confidence head
    where it has one, else the row's top probability): llama.cpp's --spec-draft-p-min."""

    def __init__(self, target: Model, head: HeadModel, name: str, *, p_min: float = 0.0) -> None:
        facts = head.facts
        super().__init__(target, BlockContext(head, target), name, p_min=p_min)
        # Anchor-first (DSpark): the anchor's row is the first draft, a block of b drafts b rows.
        # DFlash: the anchor's row predicts nothing new, b drafts take b + 1 rows.
        self.anchor_first = facts.markov and facts.sample_from_anchor
        self.max_k = facts.block_size if self.anchor_first else facts.block_size - 1
        self.selector_top_k = facts.selector_top_k  # DFlash2 (0: the rows' own distributions)
        self.sources = (Source(name, block=self.max_k),)
        # (_seen: the tokens of the positions whose features the cache holds.)

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._sampler = sampler
        # A block's rows are filtered in llama.cpp's graph where the run filters the target's there
        # (DFlash2's rows ask for no logits: its selector reads them inside the graph).
        self.head.set_filters(None if self.selector_top_k else draft_filters(sampler, self.head.n_vocab))
        if self.resting:
            return
        self.head.truncate(self._kept(context))
        self._inject(context)
        self._forget_debt()

    def _inject(self, context: list[int]) -> None:
        """The features of every position the target evaluated (all but the pending token)."""
        evaluated = len(context) - 1
        start = self.head.n_past
        if evaluated > start:
            self.head.inject(self.features.rows(start, evaluated))
            self.features.release(evaluated)
        self._seen = list(context[: self.head.n_past])

    def warm_up(self) -> tuple[str, ...]:
        # A pass is 1.2-2.3 target tokens here and a process's first ~1.4x a later one: paid here, the
        # first look is a warm one, which alone settles a declined verdict (CostModel.warmed).
        kept = self.head.n_past
        try:
            decode = self.head.decode_lattice if self.selector_top_k else self.head.decode_block
            decode(self.head.mask_token, self._rows(self.max_k))
        finally:
            self.head.truncate(kept)
        return tuple(source.name for source in self.sources)

    def catch_up_costs(self) -> dict[str, tuple[int, float]]:
        # Its catch-up injects the features of what plain rounds committed: cheap against a CPU's token
        # (~0.04 ms a position here), not against a fast one; timed here, -k auto can weigh watching a
        # declined head from its first verdict.
        head = self.head
        if head.n_past:
            return {}
        features = np.zeros((CATCH_UP_TIMED, self.features.width), np.float32)
        timing = timed_catch_up(lambda n: head.inject(features[:n]), lambda: head.truncate(0))
        return {source.name: timing for source in self.sources}

    def _rows(self, k: int) -> int:
        """The block's rows for k drafts (DFlash's anchor row predicts nothing new)."""
        return k + (0 if self.anchor_first else 1)

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        n = len(context)
        k = min(k, self.max_k)
        if k < 1:
            return Draft.empty(self.name)
        t0 = time.perf_counter()
        self.head.truncate(n - 1)
        self._inject(context)
        catch_up = self._catch_up_billed(time.perf_counter() - t0)
        try:
            if self.selector_top_k:
                return self._walk(self.head.decode_lattice(context[n - 1], self._rows(k)), n, gate, catch_up)
            logits, head_confidence = self.head.decode_block(context[n - 1], self._rows(k))
            rows = logits if self.anchor_first else logits[1:]
            if head_confidence is not None and not self.anchor_first:
                head_confidence = head_confidence[1:]
            return self._propose(rows, head_confidence, n, gate, catch_up)
        finally:
            self.head.truncate(n - 1)  # the block's rows are the head's guesses, not features

    def _kept_prefix(self, confidence: list[float], gate: DraftGate | None) -> int:
        """How many of a block's positions, all known at once, to propose: up to the first below
        --draft-p-min, then the prefix the gate prices best."""
        n_keep = len(confidence)
        if self.p_min:
            n_keep = next((i for i, c in enumerate(confidence) if c < self.p_min), n_keep)
        if gate is not None:
            n_keep = min(n_keep, gate.best_prefix(confidence[:n_keep]))
        return n_keep

    def _walk(self, lattice: np.ndarray, position: int, gate: DraftGate | None, catch_up: float) -> Draft:
        """DFlash2's path through its lattice (DFlash's layout: row 0 the anchor's; row 1's scores are
        the anchor's whatever the predecessor). Greedy: from each choice its best-scoring successor, the
        whole path known before p_min and the gate cut it. Sampled: each position's q is the softmax of
        its scores (at the run's temperature) over its candidates, and the choice is drawn from it
        (keyed as the target draws with same-as-plain), the path going on from the drawn candidate; the
        gate and p_min judge a position before its draw, as a step drafter's. Banned ids (--ignore-eos)
        are never chosen."""
        top_k = self.selector_top_k
        params = self._sampler.params
        banned = params.banned
        width = self.target.n_vocab
        tokens: list[int] = []
        probs: list[Dist] = []
        confidence: list[float] = []
        held = None
        choice = 0
        for i, row in enumerate(lattice[1:]):
            scores = row[top_k + choice * top_k : top_k + (choice + 1) * top_k].astype(np.float64)
            candidates = row[:top_k].astype(np.int64)
            usable = np.isfinite(scores) & (candidates >= 0) & (candidates < width)
            if banned:
                usable &= ~np.isin(candidates, banned)
            if not usable.any():
                break  # every candidate banned (or the lattice broken): no path on from here
            if params.greedy:
                choice = int(np.flatnonzero(usable)[np.argmax(scores[usable])])
                tokens.append(int(candidates[choice]))
                confidence.append(float(1.0 / np.exp(scores[usable] - scores[choice]).sum()))
                continue
            order = np.flatnonzero(usable)
            order = order[np.argsort(candidates[order], kind="stable")]  # ascending ids, as a Dist's
            ids = np.ascontiguousarray(candidates[order])
            q = Dist(ids, np.ascontiguousarray(scores[order] / params.temperature), width)
            sure = q.top()
            go_on = (not self.p_min or sure >= self.p_min) and (gate is None or gate(i, sure))
            token = self._sampler.draft_draw(q, position + i, position)
            if not go_on:
                held = HeldPosition(token, q, sure)
                break
            tokens.append(token)
            probs.append(q)
            confidence.append(sure)
            choice = int(order[np.searchsorted(ids, token)])
        if params.greedy:
            n_keep = self._kept_prefix(confidence, gate)
            if n_keep < len(tokens):
                held = HeldPosition(tokens[n_keep], None, confidence[n_keep])
            tokens, confidence = tokens[:n_keep], confidence[:n_keep]
        return Draft(tokens, probs or None, self.name, confidence, held, catch_up, False)

    def _propose(self, rows: np.ndarray | list[Survivors], head_confidence: np.ndarray | None,
                 position: int, gate: DraftGate | None, catch_up: float) -> Draft:
        """Each row's distribution and confidence (known before any draw: a stop never depends on a
        drawn token, which would bias what is proposed), the prefix the gate and p_min keep, then the
        draws. Rows filtered in llama.cpp's graph come as their survivors (banned ids left out there)."""
        sampler = self._sampler
        params = sampler.params.unbanned
        width = self.target.n_vocab
        if not isinstance(rows, list):
            rows = [rows[i, :width] for i in range(len(rows))]
        qs: list[Dist | None] = []
        confidence: list[float] = []
        for i, row in enumerate(rows):
            if not isinstance(row, Survivors):
                mask_banned(row[None, :], sampler.params.banned)
            q = None if params.greedy else distribution(row, params, width=width)
            qs.append(q)
            if head_confidence is not None:
                confidence.append(float(head_confidence[i]))
            else:
                confidence.append(q.top() if q is not None else top_probability(row))
        n_keep = self._kept_prefix(confidence, gate)

        def draw(i: int) -> int:
            q = qs[i]
            return greedy_token(rows[i], params.banned) if q is None else \
                sampler.draft_draw(q, position + i, position)

        tokens = [draw(i) for i in range(n_keep)]
        held = None
        if n_keep < len(rows):
            q = qs[n_keep]
            held = HeldPosition(draw(n_keep), q, confidence[n_keep])
        probs = [q for q in qs[:n_keep] if q is not None] or None
        return Draft(tokens, probs, self.name, confidence[:n_keep], held, catch_up, False)
