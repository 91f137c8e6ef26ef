"""llama.cpp contexts for trained draft heads: EAGLE-3 and DFlash/DSpark drafters, which read the
target's hidden layers (llama.cpp's src/llama-ext.h hooks, common/speculative.cpp's order of calls),
and Gemma 4's assistant.

* `TargetFeatures` switches on the target's extraction of its layer inputs (the "features" a head was
  trained on) and keeps each decoded position's row until the drafter has read it.
* `Eagle3Context`: an encoder (`fc` over the features: one row g per position) and a one-layer decoder
  whose position p reads the token at p + 1 with g_p (or, for a drafted token, the head's own pre-norm
  state one position before).
* `BlockContext`: a DFlash or DSpark drafter: the features go into its KV cache (a fused projection per
  layer), then a block [last token, <mask> ...] is decoded in one pass, every row a draft position.
* `AssistantContext`: a Gemma 4 assistant, which reads no layer inputs but the target's last hidden
  state, and whose attention reads the target's own KV cache (it has none of its own).

Each runs in a context of its own over the head's GGUF, with the target's context as `ctx_other`
(a head may share the target's token embedding and output head, an assistant its KV cache). The C++
symbols of llama-ext.h are bound here as llama-cpp-python binds the MTP ones (its llama_cpp_ext).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as llc
import numpy as np
from llama_cpp import llama_cpp_ext as llc_ext

from specli.llama import (
    ARITHMETIC,
    GGML_TYPE_BF16,
    ClosedWhenCollected,
    ContextFullError,
    DecodeAborted,
    GraphFilters,
    LlamaError,
    Model,
    ModelOptions,
    attach_filters,
    batch_invariant_cache,
    buffer_view,
    detach_filters,
    filtered_output,
    repacks,
)
from specli.llama_log import ensure_backend
from specli.native import data_address
from specli.sampling import Survivors


def _bind(names: Sequence[str], argtypes: list, restype: object):
    for name in names:
        fn = getattr(llc_ext._lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = argtypes, restype
            return fn
    return None


_ctx_p, _model_p = llc.llama_context_p_ctypes, llc.llama_model_p_ctypes
# Mangled as g++/clang mangle them (Itanium ABI); llama-cpp-python's own builds on Linux and macOS.
_set_layer_inp = _bind(
    ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
    [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None)
_get_layer_inp = _bind(
    ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
    [_ctx_p, ctypes.c_uint32], ctypes.c_void_p)  # an address: TargetFeatures keeps a view per address
_target_layer_ids = _bind(("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model"),
                          [_model_p], ctypes.POINTER(ctypes.c_int32))
_target_layer_ids_n = _bind(
    ("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model"),
    [_model_p], ctypes.c_uint32)
_selector_top_k = _bind(
    ("llama_model_dflash_selector_top_k", "_Z33llama_model_dflash_selector_top_kPK11llama_model"),
    [_model_p], ctypes.c_int32)

# Architectures whose llama.cpp graph exposes its layer inputs (src/models/*.cpp set t_layer_inp): a
# head can only read the target there; elsewhere llama.cpp aborts the process at the first decode.
FEATURE_ARCHITECTURES = frozenset({
    "bailingmoe3", "deepseek4", "gemma3n", "gemma4", "gpt-oss", "hunyuan-vl", "lfm2", "llama", "mimo2",
    "minimax01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "nemotron_h_moe", "qwen3",
    "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
})


# A target token dearer than this (seconds) is not timed for what its features add (TargetFeatures.tax):
# the load would take ~50 such decodes more (0.13 s at this bound), and the features' cost, a few copies
# per decode, is then a small share of a token.
TAX_TIMED_TOKEN = 0.0025
# On a cheaper token the features are timed in more pairs of blocks, up to this many seconds of decodes
# in all: a few microseconds against a 0.2 ms token is noise over 6 pairs (0.0-4.8 us across 15 timings
# of one DFlash head's features on synth's tiny set, 2.1-3.0 over 24).
TAX_SECONDS = 0.03
TAX_MOST_BLOCKS = 30


def available() -> str | None:
    """None when this llama-cpp-python exports the hooks heads need, else what is missing."""
    missing = [name for name, fn in (("llama_set_embeddings_layer_inp", _set_layer_inp),
                                     ("llama_get_embeddings_layer_inp", _get_layer_inp),
                                     ("llama_model_target_layer_ids", _target_layer_ids),
                                     ("llama_model_target_layer_ids_n", _target_layer_ids_n)) if fn is None]
    return f"this llama-cpp-python's libllama exports no {', '.join(missing)}" if missing else None


class TargetFeatures:
    """The inputs of `layers` of the target at each position it decodes, concatenated per position (the
    features a head reads: llama.cpp's llama_get_embeddings_layer_inp), kept from the first position a
    drafter has not read (`release`) to the last decoded. Rows past the target's cache are stale."""

    def __init__(self, target: Model, layers: Sequence[int]) -> None:
        problem = available()
        if problem:
            raise LlamaError(problem)
        self.target, self.layers = target, tuple(int(i) for i in layers)
        n_embd = target.n_embd
        self.width = len(self.layers) * n_embd
        self._rows = np.zeros((64, self.width), np.float32)
        self._rows_at = self._rows.ctypes.data  # where row 0 lives (a plain round's row is copied there)
        self._layer_bytes = n_embd * 4
        self._base = 0  # position of row 0
        self._upto = 0  # positions [_base, _upto) hold rows recorded after their decode
        self._views: dict[int, tuple[int, np.ndarray]] = {}  # layer -> (buffer address, its rows)
        self.paused = True
        self.resume()

    def pause(self) -> None:
        """Stop recording (llama.cpp hands out no layer inputs): a drafter that rests reads none."""
        if not self.paused:
            self._switch(False)

    def resume(self) -> None:
        """Record again from the next decode on; what the decodes meanwhile held is not here (`rows`
        decodes it again)."""
        if self.paused:
            self._base = self._upto = self.target.n_past
            self._switch(True)

    def _switch(self, on: bool) -> None:
        for lid in sorted(set(self.layers)):
            _set_layer_inp(self.target.context_pointer, lid, on)
        self.target.attach_recorder(self if on else None)
        self.paused = not on

    def tax(self, blocks: int = 6, decodes: int = 3, slowest: float = TAX_TIMED_TOKEN) -> float | None:
        """Seconds the features add to one plain token: the target's one-token decode with them on and
        off, in pairs of blocks in alternating order (the median of the pairs' differences, which a
        change of the machine's speed between pairs leaves alone; the first decode after each switch
        untimed, as llama.cpp plans its graph again); at least `blocks` pairs, more where a token is
        cheap (TAX_SECONDS). Only on an empty cache (at load; the decodes are dropped after), and None
        there too where a token costs more than `slowest`."""
        target = self.target
        if target.n_past or self.paused:
            return None
        token = max(0, target.vocab_info().bos)

        def timed(n: int) -> float:
            seconds = 0.0
            for _ in range(n):
                started = time.perf_counter()
                target.decode([token], outputs="last")
                seconds += time.perf_counter() - started
                target.truncate(0)
            return seconds / n

        timed(1)  # the first decode of a context builds its graph
        token_seconds = statistics.median(timed(1) for _ in range(3))
        if token_seconds > slowest:
            return None
        per_pair = 2 * (decodes + 1) * token_seconds
        blocks = max(blocks, min(TAX_MOST_BLOCKS, int(TAX_SECONDS / per_pair) if per_pair > 0 else blocks))
        differences: list[float] = []
        try:
            for block in range(blocks):
                pair = {}
                for state in (True, False) if block % 2 == 0 else (False, True):
                    (self.resume if state else self.pause)()
                    timed(1)
                    pair[state] = timed(decodes)
                differences.append(pair[True] - pair[False])
        finally:
            self.resume()
            self._base = self._upto = target.n_past
        return max(0.0, statistics.median(differences))

    def before_decode(self, pos0: int) -> None:
        self._upto = min(self._upto, pos0)

    def after_decode(self, pos0: int, m: int) -> None:
        if not self._base <= pos0 <= self._upto:
            self._base = self._upto = pos0  # a gap or a rewind before what is kept: start over here
        need = pos0 + m - self._base
        if need > len(self._rows):
            grown = np.zeros((max(need, 2 * len(self._rows)), self.width), np.float32)
            grown[: self._upto - self._base] = self._rows[: self._upto - self._base]
            self._rows, self._rows_at = grown, grown.ctypes.data
        if m == 1:
            # A plain round's one row, layer by layer straight from llama.cpp's buffers: numpy views
            # and slices cost ~10 us a layer right after a decode, a ctypes copy ~1.
            at, size = self._rows_at + (pos0 - self._base) * self.width * 4, self._layer_bytes
            ctx = self.target.context_pointer
            for k, lid in enumerate(self.layers):
                ctypes.memmove(at + k * size, self._layer_address(ctx, lid), size)
            self._upto = pos0 + 1
            return
        n_embd = self.target.n_embd
        out = self._rows[pos0 - self._base : need]
        for k, lid in enumerate(self.layers):
            out[:, k * n_embd : (k + 1) * n_embd] = self._layer_inputs(lid, m)
        self._upto = pos0 + m

    def _layer_address(self, ctx: llc.llama_context_p, lid: int) -> int:
        """Where llama.cpp keeps the last decode's inputs of layer `lid`."""
        address = _get_layer_inp(ctx, lid)
        if not address:
            raise LlamaError(f"{self.target.path.name}: llama.cpp kept no input of layer {lid}")
        return address

    def _layer_inputs(self, lid: int, m: int) -> np.ndarray:
        """The last decode's inputs of layer `lid`, m rows (a view of llama.cpp's output buffer, kept
        while the buffer stays where it is: making one costs more than the copy of a row)."""
        address = self._layer_address(self.target.context_pointer, lid)
        kept = self._views.get(lid)
        if kept is None or kept[0] != address or kept[1].shape[0] < m:
            n_embd = self.target.n_embd
            rows = max(m, self.target.n_batch)
            view = np.frombuffer((ctypes.c_float * (rows * n_embd)).from_address(address), np.float32)
            kept = self._views[lid] = (address, view.reshape(rows, n_embd))
        return kept[1][:m]

    def held(self) -> tuple[int, int]:
        """The positions whose rows are here now: [start, stop)."""
        return self._base, min(self._upto, self.target.n_past)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows of positions start..stop-1 (a view, valid until the next target decode). Positions
        released or never decoded with extraction on are decoded again first (`refill`)."""
        if start < self._base or stop > min(self._upto, self.target.n_past):
            self.resume()
            self.refill(start)
        return self._rows[start - self._base : stop - self._base]

    def release(self, upto: int) -> None:
        """A drafter has read every row before `upto`: they may go."""
        upto = min(max(upto, self._base), self._upto)
        drop = upto - self._base
        if drop and drop * 2 >= len(self._rows):
            kept = self._upto - upto
            self._rows[:kept] = self._rows[drop : drop + kept]
            self._base = upto
        elif drop == self._upto - self._base:
            self._base = upto

    def refill(self, start: int) -> None:
        """Decode the target's cached positions from `start` again, so that their rows are recorded
        (a drafter whose state went back before what is kept: a new prompt sharing a prefix). The
        cache ends up holding the same tokens as before."""
        target = self.target
        tokens = list(target.tokens)
        if start >= len(tokens):
            return
        if target.can_truncate(start):
            target.truncate(start)
        else:
            target.reset()
        target.decode(tokens[target.n_past :], outputs="none")


@dataclass(frozen=True)
class HeadFacts:
    """What a head's GGUF says of itself and of the target it was trained for."""

    architecture: str  # "eagle3" or "dflash"
    n_embd: int
    n_vocab: int
    target_layers: tuple[int, ...]
    target_hidden: int | None  # EAGLE-3's target_hidden_size
    block_size: int  # DFlash/DSpark: tokens a block decodes (0 for EAGLE-3)
    markov: bool  # DSpark: a Markov head biases each block position by the one before
    confidence_head: bool  # DSpark: a head that predicts each position's acceptance
    sample_from_anchor: bool  # DSpark: the anchor's row is the first draft (else DFlash's layout)
    causal: bool  # block-internal attention causal (DFlash default: not)
    selector_top_k: int  # DFlash2: the candidates its selector keeps per position (0: not DFlash2)


class HeadModel(ClosedWhenCollected):
    """A head's GGUF loaded by llama.cpp (no context): its facts, for checks before a context exists."""

    def __init__(self, path: str | Path, options: ModelOptions) -> None:
        self.path = Path(path)
        ARITHMETIC.claim(options.batch_invariant)
        ensure_backend()
        mparams = llc.llama_model_default_params()
        mparams.n_gpu_layers = options.n_gpu_layers
        mparams.use_extra_bufts = repacks(options)
        self._model = llc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise LlamaError(f"{self.path}: llama.cpp could not load the draft head "
                             "(run with --verbose for its log)")
        try:
            self.facts = self._read_facts()
        except BaseException:
            self.close()
            raise

    def token_text(self, token: int) -> bytes:
        return llc.llama_vocab_get_text(llc.llama_model_get_vocab(self._model), token) or b""

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = llc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def _read_facts(self) -> HeadFacts:
        arch = self.meta("general.architecture") or "unknown"
        n = int(_target_layer_ids_n(self._model)) if _target_layer_ids_n else 0
        ptr = _target_layer_ids(self._model) if _target_layer_ids and n else None
        layers = tuple(int(ptr[i]) for i in range(n)) if ptr else ()

        def number(key: str) -> int | None:
            text = self.meta(key)
            try:
                return int(text) if text is not None else None
            except ValueError:
                return None

        def flag(key: str, default: bool) -> bool:
            text = self.meta(key)
            return default if text is None else text == "true"

        has_markov = self.meta("dflash.block_size") is not None and _has_tensor(self.path, "markov_w1.weight")
        return HeadFacts(
            architecture=arch,
            n_embd=int(llc.llama_model_n_embd(self._model)),
            n_vocab=int(llc.llama_vocab_n_tokens(llc.llama_model_get_vocab(self._model))),
            target_layers=layers,
            target_hidden=number(f"{arch}.target_hidden_size"),
            block_size=number("dflash.block_size") or (16 if arch == "dflash" else 0),
            markov=has_markov,
            confidence_head=has_markov and flag("dflash.has_confidence_head", True),
            sample_from_anchor=has_markov and flag("dflash.sample_from_anchor", True),
            causal=flag("dflash.attention.causal", False),
            selector_top_k=int(_selector_top_k(self._model)) if _selector_top_k else 0,
        )

    def close(self) -> None:
        if getattr(self, "_model", None):
            llc.llama_model_free(self._model)
            self._model = None



def _has_tensor(path: Path, name: str) -> bool:
    from specli.gguf_info import read_gguf_info

    try:
        return any(t.name == name for t in read_gguf_info(path).all_tensors)
    except Exception:
        return False


class SideContext(ClosedWhenCollected):
    """A llama.cpp context beside the target's (which it names as ctx_other, and whose abort flag stops
    it too): one sequence, a plain KV cache, batches of the extended API (a row can carry a token, an
    embedding, or both). It knows how many positions its cache holds (`n_past`); its drafter keeps
    what they mean."""

    def __init__(self, model: llc.llama_model_p, target: Model, *, label: str, n_embd: int, n_vocab: int,
                 ctx_type: int = llc.LLAMA_CONTEXT_TYPE_DEFAULT, n_batch: int | None = None,
                 bf16_cache: bool = False, filtered_rows: int = 1) -> None:
        self.target, self.label = target, label
        self._ctx = None
        self._batch = None
        self._chain = None  # llama.cpp's sampler chain of `filters`, once attached
        self.filters: GraphFilters | None = None
        self._filtered_views: dict[tuple[int, int], np.ndarray] = {}
        cparams = llc.llama_context_default_params()
        cparams.n_ctx = target.n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch or target.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = target.n_threads
        cparams.no_perf = True
        cparams.ctx_type = ctx_type
        cparams.ctx_other = target.context_pointer
        cparams.n_rs_seq = 0
        cparams.n_outputs_max_per_seq = filtered_rows  # the output rows a decode's filters take
        if bf16_cache:
            cparams.type_k = cparams.type_v = GGML_TYPE_BF16
        cparams.abort_callback, cparams.abort_callback_data = target.abort_callback
        self._ctx = llc.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise LlamaError(f"{label}: llama.cpp could not create its context "
                             "(run with --verbose for its log)")
        self.n_batch = int(cparams.n_batch)
        self._mem = llc.llama_get_memory(self._ctx)
        self._batch = llc.llama_batch_ext_init(self._ctx)
        if not self._batch:
            self.close()
            raise LlamaError(f"{label}: llama.cpp could not allocate a batch")
        self.n_embd, self.n_vocab = n_embd, n_vocab
        self.n_past = 0
        self.decode_seconds = 0.0
        self._pos = (llc.llama_pos * 4)()
        # One llama_embd for every row added (llama.cpp copies it, and the row, at each call): its
        # data pointer is written in place, where a new struct and a cast cost ~3 us a row.
        self._embd = llc.llama_embd(None, 1, 0)
        self._embd_data = ctypes.c_void_p.from_buffer(self._embd, llc.llama_embd.data.offset)
        self._views: dict[tuple[int, int], np.ndarray] = {}
        self._nextn_views: dict[tuple[int, int], np.ndarray] = {}

    def _add(self, pos: int, token: int | None = None, embd: np.ndarray | None = None,
             output: bool = False) -> None:
        b = self._batch
        e = None
        if embd is not None:  # a contiguous float32 row (the callers' np.ascontiguousarray)
            e = self._embd
            self._embd_data.value = data_address(embd)
            e.n_embd = embd.shape[0]
        idx = llc.llama_batch_ext_add_token(b, 0, int(token)) if token is not None else \
            llc.llama_batch_ext_add_embd(b, 0, e)
        if idx < 0:
            raise LlamaError(f"llama.cpp refused a batch entry of {self.label} (error {idx})")
        self._pos[0] = self._pos[1] = self._pos[2] = pos  # M-RoPE drafts read the first three
        self._pos[3] = 0
        llc.llama_batch_ext_set_pos(b, idx, self._pos)
        if token is not None and embd is not None:
            llc.llama_batch_ext_set_embd_token(b, idx, e)  # llama.cpp copies it into the batch
        if output:
            llc.llama_batch_ext_set_output_logits(b, idx, True)

    def _process(self, kind: int, n_new: int) -> None:
        """Run the batch built since clear(); a decode's rows take the next n_new cache positions."""
        if self.n_past + n_new > self.target.n_ctx:
            raise ContextFullError(f"context full: {self.label} holds {self.target.n_ctx} tokens")
        t0 = time.perf_counter()
        try:
            rc = llc.llama_process(self._ctx, kind, self._batch)
            # As Model's decode: a GPU's graph may still be running when llama_process returns, and
            # the wait would otherwise land in the next read of an output, or in no read at all (a
            # catch-up's rows have none), outside the time counted here and outside what the
            # drafter's catch-up is priced at.
            llc.llama_synchronize(self._ctx)
            self.decode_seconds += time.perf_counter() - t0
            if rc == 0:
                # Counted inside the try: an interruption between the decode and the count would
                # leave the cache ahead of n_past with nothing to resync it.
                self.n_past += n_new
        except BaseException:
            self._resync()
            raise
        if rc != 0:
            self._resync()
            if rc == 2:
                raise DecodeAborted(f"{self.label}: the decode was stopped")
            raise LlamaError(f"llama.cpp's decode of {self.label} failed with code {rc}")

    def _resync(self) -> None:
        """Make n_past describe the cache again after a failure (or an interruption, which lands
        between any two bytecodes): what was decoded but not counted is dropped rather than guessed."""
        held = int(llc.llama_memory_seq_pos_max(self._mem, 0)) + 1
        if held > self.n_past:
            llc.llama_memory_seq_rm(self._mem, 0, self.n_past, -1)
        else:
            self.n_past = held

    def _logits(self, rows: int) -> np.ndarray:
        """The first rows of llama.cpp's logits buffer: a view, valid until the next decode."""
        ptr = llc.llama_get_logits(self._ctx)
        if not ptr:
            raise LlamaError(f"llama.cpp returned no logits of {self.label}")
        return buffer_view(self._views, ptr, rows, self.n_vocab)

    def _nextn(self, rows: int) -> np.ndarray:
        ptr = llc_ext.llama_get_embeddings_nextn(self._ctx)
        if not ptr:
            raise LlamaError(f"llama.cpp returned no state of {self.label}")
        return buffer_view(self._nextn_views, ptr, rows, self.n_embd)

    def truncate(self, n_keep: int) -> None:
        """Drop positions n_keep.. (drafted positions, a block, a rejected suffix)."""
        if n_keep >= self.n_past:
            return
        n_keep = max(n_keep, 0)
        try:
            llc.llama_memory_seq_rm(self._mem, 0, n_keep, -1)
            self.n_past = n_keep
        except BaseException:
            self._resync()
            raise

    def reset(self) -> None:
        try:
            llc.llama_memory_clear(self._mem, True)
            self.n_past = 0
        except BaseException:
            self._resync()
            raise

    # -- filters in the graph (backend sampling): a step's one output row crosses as its survivors --

    def set_filters(self, filters: GraphFilters | None) -> None:
        """Filter each output row in llama.cpp's graph with `filters` from the next decode on (None: the
        whole row crosses), as the target's rows are where the run samples in the graph: only the
        survivors cross, not a row over the whole vocabulary (llama.cpp's draft-eagle3 and draft-mtp
        keep top-k 10 there). At most `filtered_rows` output rows a decode (llama.cpp's
        n_outputs_max_per_seq); each change makes llama.cpp plan the graph again."""
        if filters == self.filters:
            return
        if self._chain is not None:
            chain, self._chain = self._chain, None
            detach_filters(self._ctx, chain)
        self.filters = filters

    def _attach_filters(self) -> None:
        """Before a decode with an output row: the chain of `filters`, if any and not attached yet."""
        if self.filters is not None and self._chain is None:
            self._chain = attach_filters(self._ctx, self.filters, self.n_vocab, self.label)

    def _last_row(self) -> np.ndarray | Survivors:
        """The last decode's output row: its logits (a view, valid until the next decode), or with the
        filters attached its survivors (copies)."""
        return self._output_rows(1)[0]

    def _output_rows(self, n: int) -> np.ndarray | list[Survivors]:
        """The last decode's n output rows: their logits (a view, valid until the next decode), or with
        the filters attached each row's survivors (copies)."""
        if self._chain is None:
            return self._logits(n)
        rows = filtered_output(self._ctx, n, self.n_vocab, self._filtered_views, self.label,
                               argmax=self.filters.argmax)
        return [Survivors(*rows.survivors(i)) for i in range(n)]

    def close(self) -> None:
        if self._batch:
            llc.llama_batch_ext_free(self._batch)
            self._batch = None
        if self._ctx:
            llc.llama_free(self._ctx)
            self._ctx = None
        if self._chain is not None:
            llc.llama_sampler_free(self._chain)  # after the context that pointed to it
            self._chain = None



class MTPContext(SideContext):
    """A context of type LLAMA_CONTEXT_TYPE_MTP over a target Model loaded with load_mtp: the GGUF's
    MTP (NextN) block as a drafter, no second model (common/speculative.cpp's draft-mtp).

    Its cache position p holds token x_p read together with the hidden state h_{p-1} that predicted
    it (zeros at p = 0); the logits there predict x_{p+1}. It has a plain KV cache (the MTP block is
    one attention layer), so any suffix truncates. `tokens`: what its cache holds.
    """

    def __init__(self, target: Model) -> None:
        if not target.records_hidden:
            raise LlamaError(f"{target.path.name}: load the target with load_mtp first")
        super().__init__(target.model_pointer, target, label=f"{target.path.name}'s MTP layers",
                         n_embd=target.n_embd, n_vocab=target.n_vocab, ctx_type=llc.LLAMA_CONTEXT_TYPE_MTP)
        # Unmasked: a row for every token of the batch. Masked, llama.cpp copies the first n_outputs
        # rows of the MTP graph's h (all tokens) instead of the output rows: a catch-up batch with
        # its last token as output would hand back the first token's h.
        llc_ext.llama_set_embeddings_nextn(self._ctx, True, False)
        self.tokens: list[int] = []
        self._zeros = np.zeros(target.n_embd, dtype=np.float32)

    def decode(self, tokens: Sequence[int], hidden: np.ndarray) -> tuple[np.ndarray | Survivors, np.ndarray]:
        """Evaluate `tokens` at the next positions, token i read with hidden[i] (the hidden state of
        the position before it). Returns the last position's logits row (a view, valid until the next
        decode; with filters, its survivors) and its own hidden state (a copy): what the MTP head
        predicts next, and the h to read with the token drawn from it."""
        n = len(tokens)
        if n == 0 or hidden.shape != (n, self.n_embd):
            raise ValueError(f"MTP decode needs one hidden row per token: {n} tokens, rows {hidden.shape}")
        if self.n_past + n > self.target.n_ctx:
            raise ContextFullError(f"context full: the MTP context holds {self.target.n_ctx} tokens")
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        self._attach_filters()
        start = 0
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            llc.llama_batch_ext_clear(self._batch)
            for i, token in enumerate(chunk):
                self._add(self.n_past + i, token=token, embd=hidden[start + i], output=start + i == n - 1)
            try:
                self._process(llc.LLAMA_PROCESS_TYPE_DECODE, len(chunk))
                self.tokens.extend(chunk)
            except BaseException:
                self._resync()
                raise
        h = llc_ext.llama_get_embeddings_nextn_ith(self._ctx, n - start - 1)  # the last chunk's last row
        if not h:
            raise LlamaError("llama.cpp returned no MTP output")
        # The logits row is a view (a draft step reads it before the next decode), h a copy (the
        # next decode reads it as its input)
        return self._last_row(), buffer_view(self._nextn_views, h, 1, self.n_embd)[0].copy()

    def _resync(self) -> None:
        super()._resync()
        if len(self.tokens) < self.n_past:  # decoded and counted, not yet recorded: give them up
            super().truncate(len(self.tokens))
        del self.tokens[self.n_past :]

    def truncate(self, n_keep: int) -> None:
        super().truncate(n_keep)
        del self.tokens[self.n_past :]

    def reset(self) -> None:
        super().reset()
        self.tokens.clear()

    def zeros(self) -> np.ndarray:
        """The hidden state read with position 0 (there is none before it)."""
        return self._zeros


class HeadContext(SideContext):
    """A context over a trained head (HeadModel, which it takes over) beside the target."""

    def __init__(self, head: HeadModel, target: Model, filtered_rows: int = 1) -> None:
        self.head = head
        super().__init__(head._model, target, label=f"the draft head {head.path.name}",
                         n_embd=head.facts.n_embd, n_vocab=head.facts.n_vocab,
                         n_batch=max(64, min(target.n_batch, target.n_ctx)),
                         bf16_cache=batch_invariant_cache(target.options), filtered_rows=filtered_rows)

    def close(self) -> None:
        super().close()
        self.head.close()


class Eagle3Context(HeadContext):
    """EAGLE-3: position p of the decoder's cache holds the token at p + 1 read with g_p; its logits
    there predict the token at p + 2 (common/speculative.cpp's draft-eagle3)."""

    def __init__(self, head: HeadModel, target: Model) -> None:
        super().__init__(head, target)
        # Rows of the pre-norm state only for output tokens: the decoder's next g.
        llc_ext.llama_set_embeddings_nextn(self._ctx, True, True)

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g for each row of target features (fc, and the norm some heads put before it)."""
        features = np.ascontiguousarray(features, dtype=np.float32)
        out = np.empty((len(features), self.n_embd), np.float32)
        for start in range(0, len(features), self.n_batch):
            chunk = features[start : start + self.n_batch]
            llc.llama_batch_ext_clear(self._batch)
            for j, row in enumerate(chunk):
                self._add(self.n_past + j, embd=row, output=True)  # the encoder reads no positions
            self._process(llc.LLAMA_PROCESS_TYPE_ENCODE, 0)
            out[start : start + len(chunk)] = self._nextn(len(chunk))
        return out

    def decode(self, tokens: Sequence[int], states: np.ndarray, *, output: bool
               ) -> tuple[np.ndarray | Survivors, np.ndarray] | None:
        """Decode (tokens[i], states[i]) at the next positions. With `output`, the last position's
        logits (a view, valid until the next decode; with filters, its survivors) and pre-norm state
        (a copy); the head's graph computes logits for every row and llama.cpp hands out the first
        rows, so an output decode is one token."""
        states = np.ascontiguousarray(states, dtype=np.float32)
        if output and len(tokens) != 1:
            raise ValueError("an EAGLE-3 decode with output is one token")
        if output:
            self._attach_filters()
        for start in range(0, len(tokens), self.n_batch):
            llc.llama_batch_ext_clear(self._batch)
            chunk = tokens[start : start + self.n_batch]
            for j, token in enumerate(chunk):
                self._add(self.n_past + j, token=token, embd=states[start + j], output=output)
            self._process(llc.LLAMA_PROCESS_TYPE_DECODE, len(chunk))
        if not output:
            return None
        return self._last_row(), self._nextn(1)[0].copy()


class BlockContext(HeadContext):
    """DFlash/DSpark: the target's features injected into the cache position by position, then a
    block decoded at once (non-causal inside the block unless the head says otherwise)."""

    def __init__(self, head: HeadModel, target: Model) -> None:
        super().__init__(head, target, filtered_rows=max(1, head.facts.block_size))
        facts = head.facts
        self.mask_token = int(llc.llama_vocab_mask(llc.llama_model_get_vocab(head._model)))
        if self.mask_token < 0:
            self.close()
            raise LlamaError(f"{head.path.name}: a DFlash drafter without a mask token "
                             "(tokenizer.ggml.mask_token_id)")
        llc.llama_set_causal_attn(self._ctx, facts.causal)
        # DSpark's confidence head answers in the pre-norm rows (one value repeated over each), rows
        # that ask for logits only; DFlash2's lattice in every row of a block, none of which asks.
        llc_ext.llama_set_embeddings_nextn(self._ctx, True, not facts.selector_top_k)

    def inject(self, features: np.ndarray) -> None:
        """The target's features of the next positions, into the cache."""
        features = np.ascontiguousarray(features, dtype=np.float32)
        for start in range(0, len(features), self.n_batch):
            chunk = features[start : start + self.n_batch]
            llc.llama_batch_ext_clear(self._batch)
            for j, row in enumerate(chunk):
                self._add(self.n_past + j, embd=row)
            self._process(llc.LLAMA_PROCESS_TYPE_DECODE, len(chunk))

    def decode_block(self, anchor: int, n: int) -> tuple[np.ndarray | list[Survivors], np.ndarray | None]:
        """[anchor, <mask> x (n - 1)] at the next positions, every row an output: their logits (a view,
        valid until the next decode; with filters, each row's survivors) and, with a confidence head,
        each row's confidence. The block stays in the cache until `truncate`."""
        self._attach_filters()
        self._decode_block(anchor, n, output=True)
        confidence = self._nextn(n)[:, 0].copy() if self.head.facts.confidence_head else None
        return self._output_rows(n), confidence

    def decode_lattice(self, anchor: int, n: int) -> np.ndarray:
        """DFlash2: [anchor, <mask> x (n - 1)] at the next positions, and the selector's lattice (a view,
        valid until the next decode): row i >= 1 holds position i's top_k candidate ids (as floats),
        then top_k x top_k transition scores, the scores from predecessor candidate p at p x top_k (row
        1's are the anchor's, repeated). No row asks for logits, as llama.cpp's draft-dflash asks none:
        the selector reads them inside the graph. The block stays in the cache until `truncate`."""
        self._decode_block(anchor, n, output=False)
        return self._nextn(n)

    def _decode_block(self, anchor: int, n: int, *, output: bool) -> None:
        llc.llama_batch_ext_clear(self._batch)
        for j in range(n):
            self._add(self.n_past + j, token=anchor if j == 0 else self.mask_token, output=output)
        self._process(llc.LLAMA_PROCESS_TYPE_DECODE, n)


class AssistantContext(SideContext):
    """A Gemma 4 assistant (llama.cpp's gemma4-assistant, run by its draft-mtp): a few layers over
    [the target's embedding of a token ; a hidden state], whose attention reads the target's own KV
    cache (its last sliding-window layer and its last full one), so it writes no cache of its own and
    has nothing to roll back. Every step of a draft is decoded at the position of the round's pending
    token: the first with the target's post-norm hidden state of the position before, each next one
    with the assistant's own output state (common/speculative.cpp's shared-memory mode)."""

    def __init__(self, head: HeadModel, target: Model) -> None:
        self.head = head
        super().__init__(head._model, target, label=f"the assistant {head.path.name}",
                         n_embd=target.n_embd, n_vocab=head.facts.n_vocab,
                         ctx_type=llc.LLAMA_CONTEXT_TYPE_MTP, n_batch=8)
        llc_ext.llama_set_embeddings_nextn(self._ctx, True, True)
        self._zeros = np.zeros(target.n_embd, dtype=np.float32)

    def step(self, token: int, pos: int, hidden: np.ndarray | None
             ) -> tuple[np.ndarray | Survivors, np.ndarray]:
        """`token` at `pos` read with `hidden` (None: zeros, position 0 has no state before it): the
        logits there (a view, valid until the next step; with filters, the survivors) and the state to
        read with the token drawn from them (a copy)."""
        self._attach_filters()
        row = self._zeros if hidden is None else np.ascontiguousarray(hidden, dtype=np.float32)
        llc.llama_batch_ext_clear(self._batch)
        self._add(pos, token=token, embd=row, output=True)
        self._process(llc.LLAMA_PROCESS_TYPE_DECODE, 0)  # the target's cache: nothing of its own
        return self._last_row(), self._nextn(1)[0].copy()

    # Its cache is the target's, which the target keeps: nothing to resync, truncate or reset (llama.cpp
    # would clear the target's cells with a clear of this context's memory, which shares them).
    def _resync(self) -> None:
        pass

    def truncate(self, n_keep: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def close(self) -> None:
        super().close()
        self.head.close()


def assistant_problems(target: Model, head: HeadModel) -> list[str]:
    """Why the Gemma 4 assistant `head` cannot draft for `target` (empty: it can): the target it was
    trained for (architecture, hidden size, vocabulary) and the target layers whose KV cache its
    layers read (llama.cpp's: the last sliding-window layer and the last full one)."""
    from specli.gguf_info import GGUFError, read_gguf_info

    name = head.path.name
    if target.architecture != "gemma4":
        return [f"{name} is a Gemma 4 assistant; {target.path.name} is a {target.architecture} model, "
                "and the assistant reads a Gemma 4 target's KV cache"]
    problems = []
    hidden = int(llc.llama_model_n_embd_out(head._model))
    if hidden != target.n_embd:
        problems.append(f"{name} was trained for a target of hidden size {hidden}; {target.path.name}'s is "
                        f"{target.n_embd}")
    problems += _vocabulary_problems(target, head)
    try:
        t_meta, h_meta = read_gguf_info(target.path).metadata, read_gguf_info(head.path).metadata
    except (GGUFError, OSError, ValueError):  # llama.cpp loaded both: what it checks, it has checked
        return problems
    n_layer = target.n_layer
    t_swa, h_swa = _per_layer(t_meta, "gemma4.attention.sliding_window_pattern", n_layer), \
        _per_layer(h_meta, "gemma4-assistant.attention.sliding_window_pattern", None)
    if t_swa is None or len(t_swa) < n_layer or n_layer < 2:
        return problems  # the file does not say (or not in a form read here): llama.cpp's load checks
    if not t_swa[n_layer - 2] or t_swa[n_layer - 1]:
        problems.append(f"{target.path.name}'s layers {n_layer - 2} and {n_layer - 1} are not a "
                        "sliding-window layer and a full one, whose caches a Gemma 4 assistant reads")
        return problems
    for swa, shared in ((True, n_layer - 2), (False, n_layer - 1)):
        if h_swa is not None and swa not in h_swa:
            continue
        suffix = "_swa" if swa else ""
        t_dim = _scalar(t_meta.get(f"gemma4.attention.key_length{suffix}"))
        h_dim = _scalar(h_meta.get(f"gemma4-assistant.attention.key_length{suffix}"))
        if t_dim is not None and h_dim is not None and t_dim != h_dim:
            problems.append(f"{name}'s {'sliding-window' if swa else 'full'} layers have heads of {h_dim}; "
                            f"{target.path.name}'s layer {shared}, whose cache they read, has {t_dim}")
        t_kv = _per_layer(t_meta, "gemma4.attention.head_count_kv", n_layer)
        h_kv = _per_layer(h_meta, "gemma4-assistant.attention.head_count_kv", len(h_swa) if h_swa else None)
        if t_kv is not None and len(t_kv) >= n_layer and h_kv is not None and h_swa is not None:
            wanted = {int(h_kv[i]) for i in range(min(len(h_kv), len(h_swa))) if h_swa[i] == swa}
            if wanted and wanted != {int(t_kv[shared])}:
                kind = "sliding-window" if swa else "full"
                problems.append(f"{name}'s {kind} layers read {sorted(wanted)} KV heads; "
                                f"{target.path.name}'s layer {shared} has {int(t_kv[shared])}")
    return problems


def _scalar(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _per_layer(meta: dict, key: str, n_layer: int | None) -> list | None:
    """A per-layer key (an array, or one value for every layer; n_layer None: an array only)."""
    value = meta.get(key)
    if isinstance(value, list | tuple):
        return list(value)
    if n_layer is not None and isinstance(value, int | float | bool):
        return [value] * n_layer
    return None


def head_problems(target: Model, head: HeadModel) -> list[str]:
    """Why `head` cannot draft for `target` (empty: it can): each problem names what differs."""
    facts, name = head.facts, head.path.name
    problems = []
    if target.architecture not in FEATURE_ARCHITECTURES:
        problems.append(f"this llama.cpp hands a trained drafter no hidden layers of a {target.architecture} "
                        f"target (it does for {', '.join(sorted(FEATURE_ARCHITECTURES))})")
    n_layer = target.n_layer
    beyond = [i for i in facts.target_layers if not 0 <= i < n_layer]
    if not facts.target_layers:
        problems.append(f"{name} names no target layers to read ({facts.architecture}.target_layers)")
    elif beyond:
        problems.append(f"{name} reads target layers {list(facts.target_layers)}, but {target.path.name} has "
                        f"{n_layer} layers (0..{n_layer - 1}): it was trained for another target")
    if facts.architecture == "eagle3" and len(facts.target_layers) != 3:
        problems.append(f"{name} reads {len(facts.target_layers)} target layers; an EAGLE-3 head reads 3")
    hidden = facts.target_hidden if facts.architecture == "eagle3" else facts.n_embd
    if hidden is not None and hidden != target.n_embd:
        problems.append(f"{name} was trained for a target of hidden size {hidden}; {target.path.name}'s is "
                        f"{target.n_embd}")
    return problems + _vocabulary_problems(target, head)


def _vocabulary_problems(target: Model, head: HeadModel) -> list[str]:
    """A head's vocabulary against the target's: its size, then every few-thousandth token's text."""
    n_vocab, name = head.facts.n_vocab, head.path.name
    if n_vocab != target.n_vocab:
        return [f"{name} has a vocabulary of {n_vocab} tokens; {target.path.name}'s has {target.n_vocab}"]
    step = max(1, n_vocab // 2000)
    differ = next((i for i in range(0, n_vocab, step) if head.token_text(i) != target.token_text(i)), None)
    if differ is None:
        return []
    return [f"{name}'s token {differ} is {head.token_text(differ)!r}, "
            f"{target.path.name}'s is {target.token_text(differ)!r}: another vocabulary"]
