"""Self-drafting from the target's own MTP (multi-token prediction, "NextN") layers: no second model.

As llama.cpp's draft-mtp (common/speculative.cpp): the MTP context's position p reads token x_p with
the target's hidden state h_{p-1}, and its logits there predict x_{p+1}. Positions of committed
tokens are evaluated with the target's own hidden states (recorded by the target Model at every
decode, verify batches included), so they never need evaluating again. A drafted token instead reads
the hidden state the MTP head itself produced one position before (the target has not evaluated it
yet); those positions are dropped as soon as the draft is made, and the accepted ones are evaluated
again with the target's states at the next draft, as llama.cpp does.
"""

from __future__ import annotations

import time

import numpy as np

from specli.drafters.base import (
    CATCH_UP_TIMED,
    CatchingUpDrafter,
    Draft,
    DraftGate,
    Source,
    draft_filters,
    draft_positions,
    timed_catch_up,
)
from specli.heads import MTPContext
from specli.llama import Model
from specli.sampling import (
    Noise,
    Sampler,
    SamplingParams,
)

# Architectures whose llama.cpp graph has an MTP (LLM_GRAPH_TYPE_DECODER_MTP) form, from the bundled
# src/models/*.cpp; on others an MTP context would run the trunk's graph over a cache without it.
MTP_ARCHITECTURES = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe",
    "glm5-next", "hy_v3", "mimo2", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
})


def require_mtp(target: Model) -> None:
    """--draft mtp on a GGUF without usable MTP layers: a clear error naming the way out."""
    if target.n_layer_nextn == 0:
        # Gemma 4's MTP drafter is a file of its own (gemma4-assistant), not layers of the target's.
        gemma4 = target.architecture == "gemma4"
        assistant = "its Gemma 4 assistant file (--draft ASSISTANT.gguf), " if gemma4 else ""
        raise ValueError(
            f"{target.path.name} has no MTP (multi-token prediction) layers "
            f"({target.architecture}.nextn_predict_layers is 0), so it cannot draft for itself; "
            f"use {assistant}a draft model or --draft ngram"
        )
    if target.architecture not in MTP_ARCHITECTURES:
        raise ValueError(
            f"{target.path.name} has MTP layers, but the bundled llama.cpp runs MTP heads only for "
            f"{', '.join(sorted(MTP_ARCHITECTURES))}, not {target.architecture}; "
            "use a draft model or --draft ngram"
        )


class MTPDrafter(CatchingUpDrafter):
    """Drafts with the MTP block of `target` (loaded with load_mtp) through an MTPContext.

    p_min: stop drafting in a round when the MTP head's top probability for the next position falls
    below it (llama.cpp's --draft-p-min). `name`: its registry entry's."""

    def __init__(self, target: Model, name: str, *, p_min: float = 0.0) -> None:
        self.name = name
        self.sources = (Source(name),)
        self.target = target
        self.mtp = MTPContext(target)
        self.p_min = p_min
        self._sampler = Sampler(SamplingParams(temperature=0.0), Noise(0))

    def begin(self, context: list[int], sampler: Sampler) -> None:
        self._sampler = sampler
        # Its rows are filtered in llama.cpp's graph where the run filters the target's there.
        self.mtp.set_filters(draft_filters(sampler, self.mtp.n_vocab))
        self._keep_prefix(context)
        # The target has evaluated the prompt (but its last token): read it now, as a draft model
        # prefills, so the first round's catch-up is the pending token alone.
        if self.mtp.n_past < len(context) - 1:
            self._catch_up(context[:-1])
        self._forget_debt()

    def _keep_prefix(self, context: list[int]) -> None:
        """Keep the MTP positions whose tokens are still committed, but the pending one (draft()
        reads it again for its logits). Each was evaluated with the target's hidden state of the
        tokens before it, so an equal prefix is a valid one."""
        mtp = self.mtp
        limit = min(mtp.n_past, len(context) - 1)
        held, i = mtp.tokens, 0
        while i < limit and held[i] == context[i]:
            i += 1
        mtp.truncate(i)

    def _catch_up(self, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Evaluate tokens[mtp.n_past:], each with the target's hidden state of the position before
        it; returns the last position's logits and MTP hidden state."""
        mtp, target = self.mtp, self.target
        n, m = len(tokens), mtp.n_past
        if target.n_past < n - 1:
            raise RuntimeError("the MTP drafter is ahead of the target's cache")
        if m == 0:
            hidden = np.vstack([mtp.zeros()[None, :], target.hidden_rows(0, n - 1)])
        else:
            hidden = target.hidden_rows(m - 1, n - 1)
        return mtp.decode(tokens[m:n], hidden)

    def draft(self, context: list[int], k: int, gate: DraftGate | None = None) -> Draft:
        mtp, sampler, width = self.mtp, self._sampler, self.target.n_vocab
        n = len(context)
        # Within a generation the context only grows and drafted positions are dropped below, so
        # what the MTP context holds is committed (begin() compared it token by token).
        mtp.truncate(n - 1)
        t0 = time.perf_counter()
        row, h = self._catch_up(context)
        # The last round's verified tokens are read here every round (as llama.cpp's draft-mtp does
        # after each verify); only what plain rounds left behind is a debt, not this draft's cost.
        catch_up = self._catch_up_billed(time.perf_counter() - t0)

        def next_row(token: int) -> np.ndarray:
            # The drafted token reads the MTP head's own h: the target has not evaluated it.
            nonlocal h
            next_logits, h = mtp.decode([token], h[None, :])
            return next_logits

        try:
            return draft_positions(
                row, next_row, k, n, sampler,
                width=width, p_min=self.p_min, gate=gate, name=self.name, catch_up_seconds=catch_up,
            )
        finally:
            mtp.truncate(n)  # drafted positions hold MTP hidden states, not the target's

    def warm_up(self) -> tuple[str, ...]:
        # A draft step's shape run once at load: the first look is timed warm (CostModel.warmed).
        mtp = self.mtp
        if mtp.n_past:
            return ()
        try:
            mtp.decode([max(0, self.target.vocab_info().bos)], mtp.zeros()[None, :])
        finally:
            mtp.truncate(0)
        return tuple(source.name for source in self.sources)

    def catch_up_costs(self) -> dict[str, tuple[int, float]]:
        # Each committed position a look reads costs a layer of the target (and the look its logits):
        # timed here, -k auto can weigh watching a declined head before a shadow pays for a catch-up.
        mtp = self.mtp
        if mtp.n_past:
            return {}
        token = max(0, self.target.vocab_info().bos)
        hidden = np.zeros((CATCH_UP_TIMED, self.target.n_embd), np.float32)
        timing = timed_catch_up(lambda n: mtp.decode([token] * n, hidden[:n]), lambda: mtp.truncate(0))
        return {source.name: timing for source in self.sources}

    def reset(self) -> None:
        self.mtp.reset()
        self._forget_debt()

    @property
    def decode_seconds(self) -> float:
        return self.mtp.decode_seconds

    @property
    def models(self) -> list[Model]:
        return []  # the target is the caller's; the MTP context is freed by close()

    def close(self) -> None:
        self.mtp.close()
