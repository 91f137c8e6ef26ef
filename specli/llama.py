"""llama.cpp's models, through llama-cpp-python's low-level ctypes bindings, and their errors.

A `Model` is one GGUF model with one context and one sequence: it decodes batches of tokens, asking
for logits only on the rows the caller needs, hands those rows out as zero-copy numpy views, and
truncates its KV cache when a speculative round rolls back. It remembers which tokens its cache
holds (`Model.tokens`), so the engine can reason about cache contents without asking llama.cpp.

Beside it: llama.cpp's log and backend start (specli.llama_log), its built-in chat formats
(specli.builtin_templates), the contexts of draft heads beside a Model (specli.heads), and what is
asked of the machine itself (specli.host).
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import llama_cpp as llc
import numpy as np
from llama_cpp import llama_cpp_ext as llc_ext

from specli import host
from specli.fileio import regular_file_problem
from specli.llama_log import ensure_backend
from specli.settings import CONTEXT_PADDING, DEFAULTS, MAX_CONTEXT, MAX_DRAFT_K, MAX_INT32, MAX_THREADS

if TYPE_CHECKING:
    from specli.sampling import SamplingParams


class LlamaError(RuntimeError):
    """A llama.cpp call failed; the message is meant for the user."""


class ContextFullError(LlamaError):
    """The KV cache has no room for the batch."""


class RollbackError(LlamaError):
    """A recurrent/hybrid model cannot return its state to an earlier position (beyond its bound)."""


class DecodeAborted(LlamaError):
    """A decode stopped by `Model.abort()` (from another thread); the cache holds what it held before
    the chunk that was stopped."""


class PromptTooLong(LlamaError, ValueError):
    """A prompt that leaves the context no room for a reply; front ends add what the user can do."""

    def __init__(self, n_tokens: int, n_ctx: int, *, exact: bool = True) -> None:
        self.n_tokens, self.n_ctx, self.exact = n_tokens, n_ctx, exact
        super().__init__(f"the prompt is {'' if exact else 'at least '}{n_tokens} tokens but the context "
                         f"holds {n_ctx}")


def check_prompt_fits(n_tokens: int, n_ctx: int) -> None:
    """The one rule for whether a prompt fits: its last token is decoded with the first round and the
    reply's first token needs no cache slot, so a prompt of up to n_ctx tokens gets at least one."""
    if n_tokens > n_ctx:
        raise PromptTooLong(n_tokens, n_ctx)


# Stopping a decode from another thread (a server's cancelled request) without Python in the callback:
# llama.cpp's abort callback is `bool f(void *data)`, called between graph nodes, and libc's strlen
# is such a function: it returns the length of the string at `data`, nonzero (abort) once the first
# byte of the model's flag buffer is set. The bool is read from the return register's low byte, and
# the flag holds at most one nonzero byte, so the length is 0 or 1.
_ABORT_IF_SET = ctypes.cast((ctypes.cdll.msvcrt if os.name == "nt" else ctypes.CDLL(None)).strlen,
                            llc.ggml_abort_callback)


# -- batch-invariant arithmetic ------------------------------------------------------------------------

# llama.cpp computes a token's logits in a batch with other kernels than alone, and on K-quants they
# round differently, so greedy speculation could part from plain decoding, a seeded run could print
# another text when -k auto chose other batch sizes, and a server's cached prefix (computed in other
# batch shapes) could change a seeded reply. Measured on the vendored llama.cpp's CPU backend (docs/
# exactness.md), three paths depend on the batch: (1) the tiled K-quant matmul, taken for 8 rows or
# more (ggml-cpu tiled.cpp: `rows >= 8`), sums in another order than the one-row dot product: the
# environment variable GGML_CPU_TILED_MM=0, read once per process, turns it off (`ARITHMETIC`); (2)
# repacked weights (GEMM for groups of 4 rows, GEMV for the rest): not repacked (`repacks`); (3) flash
# attention of one query over an F16/F32 cache of 512 cells or more splits the cache across the
# threads and merges the parts (ops.cpp), a batch does not: a BF16 cache takes neither path
# (`batch_invariant_cache`). With all three every row is bit-identical whatever the batch, the
# chunking of the prompt and the thread count.
TILED_MM_VARIABLE = "GGML_CPU_TILED_MM"
GGML_TYPE_BF16 = 30


class ProcessArithmetic:
    """The process's one choice of batch-invariant arithmetic or not. ggml reads TILED_MM_VARIABLE
    once, at its first matmul, so every model of a process computes alike: the first model loaded
    chooses (a value the user set in the environment stays), and a model that asks for the other
    arithmetic later is refused rather than silently given this one."""

    def __init__(self) -> None:
        self.batch_invariant: bool | None = None  # None: no model loaded yet

    def claim(self, batch_invariant: bool) -> None:
        """A model with this arithmetic is about to load: the process's choice, or LlamaError."""
        if self.batch_invariant is None:
            if batch_invariant and TILED_MM_VARIABLE not in os.environ:
                os.environ[TILED_MM_VARIABLE] = "0"
            self.batch_invariant = batch_invariant
        elif batch_invariant != self.batch_invariant:
            have, want = ("with", "without") if self.batch_invariant else ("without", "with")
            raise LlamaError(f"this process already runs its models {have} batch-invariant arithmetic "
                             f"(llama.cpp chooses it once per process): load a model {want} it in another "
                             "process")


ARITHMETIC = ProcessArithmetic()


_ATTR_UNUSED = 1 << 1  # include/llama.h, enum llama_token_attr


def repacks(opts: ModelOptions) -> bool:
    """Whether llama.cpp repacks the weights of a model loaded with `opts`: never for batch-invariant
    arithmetic or on CPUs with AMX, unless asked to."""
    if opts.repack is not None:
        return opts.repack
    return not opts.batch_invariant and not host.cpu_has_amx()


def batch_invariant_cache(opts: ModelOptions) -> bool:
    """Whether the KV cache is BF16 (batch-invariant arithmetic on the CPU; a GPU's attention kernels
    are its own, and llama.cpp's default cache type is left to it there)."""
    return opts.batch_invariant and opts.n_gpu_layers == 0


def _int_or(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


# -- filters in llama.cpp's graph ----------------------------------------------------------------------

# Filtered rows a decode may ask for in its sequence: llama.cpp refuses (llama_decode returns -1) a decode
# with more backend-sampled rows per sequence than its context was made for, and sizes its graph for that
# many (the longest round: its drafts and the pending token).
FILTERED_ROWS = MAX_DRAFT_K + 1
# ggml_top_k asserts k <= the row's width: llama.cpp aborts the process (not an error code) beyond it.
_NEG_INF = float("-inf")


@dataclass(frozen=True)
class GraphFilters:
    """The filters llama.cpp applies to a row inside its graph (backend sampling), so that only the
    survivors reach Python: banned ids at -inf (logit bias), top-k, then top-p and min-p over what top-k
    kept (llama.cpp's order; temperature is left to the host). Top-k comes first or nothing shrinks:
    llama.cpp's top-p and min-p mark the dropped ids -inf without narrowing the row. No draw: the keyed
    draw runs on the survivors. top_k 1 runs as llama.cpp's greedy sampler after the bias alone (`argmax`):
    ggml's argmax, where its top-k sorts the whole row on CUDA (docs/performance.md); the row's one
    survivor is the same, top-p and min-p keeping a row's best whatever they are, except among tied
    maxima (ggml's argmax answers with the last on the CPU, the host with the first)."""

    top_k: int
    top_p: float = 1.0
    min_p: float = 0.0
    banned: tuple[int, ...] = ()

    @property
    def argmax(self) -> bool:
        """Whether a row crosses as its argmax (llama.cpp's greedy sampler) rather than top-k's survivors."""
        return self.top_k == 1

    @staticmethod
    def of(sampling: SamplingParams, n_vocab: int, *, greedy_top_k: int = 1
           ) -> tuple[GraphFilters | None, str]:
        """The filters llama.cpp's graph applies for `sampling` over a vocabulary of n_vocab, or None and
        why it cannot. greedy_top_k: how many of a greedy row's best ids cross (1: the argmax; a
        drafter's gate needs a few more for its confidence)."""
        if sampling.greedy:
            return GraphFilters(greedy_top_k, banned=sampling.banned), "greedy"
        if not 0 < sampling.top_k < n_vocab:
            return None, ("no top-k: llama.cpp's graph would cross and sort the whole row (its top-p and "
                          "min-p do not narrow it)")
        if sampling.min_p >= 1.0:
            return None, "min-p 1: llama.cpp's graph keeps only ids strictly above the threshold, none"
        return GraphFilters(sampling.top_k, sampling.top_p, sampling.min_p, sampling.banned), "top-k first"

    def chain(self, n_vocab: int) -> llc.llama_sampler_p:
        """A new llama.cpp sampler chain of these filters (llama.cpp can attach a chain once only)."""
        chain = llc.llama_sampler_chain_init(llc.llama_sampler_chain_default_params())
        banned = sorted({t for t in self.banned if 0 <= t < n_vocab})
        if banned:
            biases = (llc.llama_logit_bias * len(banned))()
            for entry, token in zip(biases, banned, strict=True):
                entry.token, entry.bias = token, _NEG_INF
            bias = llc.llama_sampler_init_logit_bias(n_vocab, len(banned), biases)
            llc.llama_sampler_chain_add(chain, bias)
        if self.argmax:  # no draw: the greedy sampler sets the row's id and leaves its logits whole
            llc.llama_sampler_chain_add(chain, llc.llama_sampler_init_greedy())
            return chain
        llc.llama_sampler_chain_add(chain, llc.llama_sampler_init_top_k(max(1, min(self.top_k, n_vocab))))
        if self.top_p < 1.0:
            llc.llama_sampler_chain_add(chain, llc.llama_sampler_init_top_p(self.top_p, 1))
        if self.min_p > 0.0:
            llc.llama_sampler_chain_add(chain, llc.llama_sampler_init_min_p(self.min_p, 1))
        return chain


def buffer_view(views: dict[tuple[int, int], np.ndarray], ptr: ctypes._Pointer, rows: int,
                width: int) -> np.ndarray:
    """A (rows, width) numpy view of a llama.cpp output buffer at `ptr`, made once per (address, rows)
    and kept in `views`: making one costs more than the rest of a small decode call, and a buffer
    moves only when it grows."""
    key = (ctypes.addressof(ptr.contents), rows)
    view = views.get(key)
    if view is None:
        if len(views) > 64:
            views.clear()
        view = views[key] = np.ctypeslib.as_array(ptr, shape=(rows, width))
    return view


class FilteredRows:
    """The rows of one decode as llama.cpp's graph filtered them: per row, the surviving ids and their
    logits (dropped ids are absent; the order is llama.cpp's, not by id). Valid until the model's next
    decode; `survivors` hands out copies."""

    __slots__ = ("_logits", "_ids", "_counts")

    def __init__(self, logits: np.ndarray, ids: np.ndarray, counts: list[int]) -> None:
        self._logits, self._ids, self._counts = logits, ids, counts

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def width(self) -> int:
        """The vocabulary the rows are over."""
        return self._logits.shape[1]

    def survivors(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's surviving ids (int32) and their logits (float32), copies."""
        n = self._counts[i]
        logits = self._logits[i, :n]
        finite = logits > _NEG_INF  # top-p and min-p drop ids to -inf without narrowing the row
        return self._ids[i, :n][finite], logits[finite]

    def token(self, i: int) -> tuple[int, float]:
        """Row i's best id and its logit (top-k 1: its only survivor)."""
        return int(self._ids[i, 0]), float(self._logits[i, 0])


class ArgmaxRows(FilteredRows):
    """Rows llama.cpp's greedy sampler chose an id for in the graph (GraphFilters.argmax): each row's
    one survivor is that id, its logit read from the row, which crosses whole (the sampler leaves it;
    llama-bench's token copies as much)."""

    __slots__ = ()

    def survivors(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        token, logit = self.token(i)
        return np.array([token], dtype=np.int32), np.array([logit], dtype=np.float32)

    def token(self, i: int) -> tuple[int, float]:
        """Row i's argmax and its logit; NaN where ggml's argmax found none (a row of NaNs), which
        sampling.checked_token refuses as it refuses a host row's NaN maximum."""
        token = int(self._ids[i])
        if not 0 <= token < self._logits.shape[1]:
            return token, math.nan
        return token, float(self._logits[i, token])


def attach_filters(ctx: llc.llama_context_p, filters: GraphFilters, n_vocab: int,
                   what: str) -> llc.llama_sampler_p:
    """A new chain of `filters` attached to sequence 0 of `ctx` (llama.cpp's backend sampling); an
    error naming `what` where its graph cannot run them."""
    chain = filters.chain(n_vocab)
    if not llc.llama_set_sampler(ctx, 0, chain):
        llc.llama_sampler_free(chain)
        raise LlamaError(f"{what}: llama.cpp cannot run these filters in its graph")
    return chain


def detach_filters(ctx: llc.llama_context_p, chain: llc.llama_sampler_p) -> None:
    """Take `chain` off `ctx` (its next decode's rows cross whole) and free it."""
    llc.llama_set_sampler(ctx, 0, None)
    llc.llama_sampler_free(chain)


def filtered_output(ctx: llc.llama_context_p, rows: int, n_vocab: int,
                    views: dict[tuple[int, int], np.ndarray], what: str, *, argmax: bool = False
                    ) -> FilteredRows:
    """The last decode's last `rows` output rows as llama.cpp's graph filtered them, in batch order
    (views of its buffers, kept in `views`, valid until the next decode). argmax: the filters were
    GraphFilters.argmax's (each row's id chosen in the graph)."""
    first = -rows  # output rows counted from the end
    if argmax:
        ids = np.array([llc.llama_get_sampled_token_ith(ctx, i) for i in range(first, 0)], dtype=np.int64)
        logits_ptr = llc.llama_get_sampled_logits_ith(ctx, first)
        if not logits_ptr:
            raise LlamaError(f"{what}: llama.cpp's graph chose no ids")
        return ArgmaxRows(buffer_view(views, logits_ptr, rows, n_vocab), ids, [1] * rows)
    counts = [llc.llama_get_sampled_logits_count_ith(ctx, i) for i in range(first, 0)]
    logits_ptr = llc.llama_get_sampled_logits_ith(ctx, first)
    ids_ptr = llc.llama_get_sampled_candidates_ith(ctx, first)
    if not logits_ptr or not ids_ptr or not all(counts):
        raise LlamaError(f"{what}: llama.cpp's graph filtered no rows")
    # Rows lie n_vocab apart in llama.cpp's buffers.
    return FilteredRows(buffer_view(views, logits_ptr, rows, n_vocab),
                        buffer_view(views, ids_ptr, rows, n_vocab), counts)


# -- the model -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOptions:
    n_ctx: int = DEFAULTS.ctx
    n_threads: int = DEFAULTS.threads  # 0: default_threads()
    n_gpu_layers: int = DEFAULTS.gpu_layers
    n_batch: int = 512
    # Recurrent/hybrid models: positions the context can roll back (llama.cpp's n_rs_seq state
    # snapshots, where the architecture supports them). The engine never drafts more than this.
    max_rollback: int = 16
    # Load the GGUF's MTP (NextN) layers and record the hidden state of every position decoded, so an
    # MTPContext over this model can draft (llama.cpp skips those layers otherwise).
    load_mtp: bool = False
    # llama.cpp's weight repacking (its "extra buffer types": AMX, AVX2/NEON interleaved layouts).
    # None: off for batch-invariant arithmetic and on CPUs with AMX (`cpu_has_amx`), else on.
    repack: bool | None = None
    # Batch-invariant arithmetic (see above): a token's logits the same in any batch, at some cost to
    # prompt evaluation. On a GPU only the CPU's part of it applies.
    batch_invariant: bool = DEFAULTS.batch_invariant


class DecodeRecorder(Protocol):
    """Reads what a decode leaves beside the logits (a layer's inputs) before the next one."""

    def before_decode(self, pos0: int) -> None:
        """A chunk is about to be decoded at positions pos0..: anything kept from there on is stale."""

    def after_decode(self, pos0: int, m: int) -> None:
        """The chunk of m tokens at pos0.. was decoded."""


@dataclass(frozen=True)
class VocabInfo:
    vocab_type: int
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


class ClosedWhenCollected:
    """Frees what llama.cpp holds for it when garbage-collected, if close() was not called."""

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _check_options(opts: ModelOptions) -> None:
    """Refuse numbers llama.cpp takes as they come: out of range they crash it or wrap around."""
    if not 0 <= opts.n_threads <= MAX_THREADS:
        raise LlamaError(f"{opts.n_threads} threads: llama.cpp takes 0 (one per core) to {MAX_THREADS}")
    if not -1 <= opts.n_gpu_layers <= MAX_INT32:
        raise LlamaError(f"{opts.n_gpu_layers} GPU layers: llama.cpp takes -1 (all) to {MAX_INT32}")
    if not 1 <= opts.n_batch <= MAX_INT32 or not 0 <= opts.max_rollback <= MAX_INT32 - 1:
        raise LlamaError(f"batch {opts.n_batch} / rollback {opts.max_rollback} out of llama.cpp's range")
    if not 0 <= opts.n_ctx <= MAX_CONTEXT:
        raise LlamaError(
            f"a context of {opts.n_ctx} tokens is impossible: llama.cpp takes 1 to {MAX_CONTEXT}"
        )


def _load_weights(path: Path, opts: ModelOptions) -> llc.llama_model_p:
    """The GGUF at `path` loaded by llama.cpp as `opts` say, or LlamaError."""
    not_regular = regular_file_problem(path)
    if not_regular is not None:
        # llama.cpp would block forever on a FIFO and read a device until memory runs out
        raise LlamaError(f"{path}: {not_regular}; pass the path of a .gguf model file")
    mparams = llc.llama_model_default_params()
    mparams.n_gpu_layers = opts.n_gpu_layers
    mparams.load_mtp = opts.load_mtp
    mparams.use_extra_bufts = repacks(opts)
    model = llc.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise LlamaError(f"{path}: llama.cpp could not load the model (run with --verbose for its log)")
    return model


class Model(ClosedWhenCollected):
    """One GGUF model, one llama.cpp context, one sequence (seq id 0)."""

    def __init__(self, path: str | Path, options: ModelOptions | None = None) -> None:
        started = time.perf_counter()
        opts = options or ModelOptions()
        self.path = Path(path)
        self.options = opts
        self._model = None
        self._ctx = None
        self._batch = None
        _check_options(opts)
        ARITHMETIC.claim(opts.batch_invariant)
        ensure_backend()
        self._model = _load_weights(self.path, opts)
        self._vocab = llc.llama_model_get_vocab(self._model)

        threads = opts.n_threads or host.default_threads()
        n_ctx = opts.n_ctx if opts.n_ctx > 0 else llc.llama_model_n_ctx_train(self._model)
        self.requested_n_ctx = n_ctx
        try:
            self._check_kv_memory(n_ctx)
        except LlamaError:
            self.close()
            raise
        self.n_batch = max(16, min(opts.n_batch, n_ctx))
        model = self._model
        self._recurrent = bool(llc.llama_model_is_recurrent(model) or llc.llama_model_is_hybrid(model))
        if self._recurrent:
            # Snapshots are taken within one ubatch: a verify batch (k + 1 tokens) must fit in one.
            self.n_batch = max(self.n_batch, opts.max_rollback + 1)
        self.filtered_rows = min(FILTERED_ROWS, self.n_batch)  # the most rows decode_filtered takes
        self._abort_flag = ctypes.create_string_buffer(2)  # b"\0": run on; b"\1": abort (see _ABORT_IF_SET)
        self._ctx = llc.llama_init_from_model(self._model, self._context_params(n_ctx, threads))
        if not self._ctx:
            self.close()
            raise LlamaError(f"{self.path}: llama.cpp could not create a context of {n_ctx} tokens")
        self._mem = llc.llama_get_memory(self._ctx)
        self.n_ctx = llc.llama_n_ctx(self._ctx)
        self.n_threads = threads
        self.n_vocab = llc.llama_vocab_n_tokens(self._vocab)
        self._batch = llc.llama_batch_init(self.n_batch, 0, 1)
        self._batch_arrays = (self._batch.token, self._batch.pos, self._batch.logits)  # fixed pointers
        # seq_id pointers are set once: every token goes to sequence 0.
        for i in range(self.n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        self._pieces: dict[int, bytes] = {}
        self._longest_piece: int | None = None  # bytes, of the vocabulary's longest piece (fewest_tokens)
        self._eog: tuple[int, ...] | None = None
        self._is_eog: dict[int, bool] = {}
        self._logits_views: dict[tuple[int, int], np.ndarray] = {}
        self._hidden_views: dict[tuple[int, int], np.ndarray] = {}
        # Backend sampling: the filters decode_filtered applies, and the llama.cpp chain attached now
        # (attached on the first filtered decode, detached by a decode that wants raw rows).
        self._filters: GraphFilters | None = None
        self._chain: llc.llama_sampler_p | None = None
        self._filtered_views: dict[tuple[int, int], np.ndarray] = {}
        self.decode_seconds = 0.0  # wall time inside llama_decode, for the overhead figure
        self.rs_seq = int(llc.llama_n_rs_seq(self._ctx)) if self._recurrent else 0
        # Positions truncate() may drop through the state snapshots right now: llama.cpp writes them
        # per decode (slot s = the state s tokens before the end of the last ubatch) and a rollback
        # is single-use until the next decode, so this is min(rs_seq, last batch - 1), else 0.
        self._rollback_room = 0
        self._checkpoint: tuple[int, ctypes.Array[ctypes.c_uint8]] | None = None  # (position, state)
        # Reading the file and building the context, as `specli bench` reports it per model.
        self.load_seconds = time.perf_counter() - started
        # With load_mtp: the hidden state (h_nextn) at each cached position, row p for position p; rows
        # at and past n_past are stale. An MTP context reads h_{p-1} with token p.
        self._hidden: np.ndarray | None = None
        self._hidden_upto = 0  # rows of positions 0.. up to here were recorded after their decode
        self.n_embd = int(llc.llama_model_n_embd(self._model))
        # Told of every decode (heads.TargetFeatures: a trained drafter reads the target's layers).
        self._recorder: DecodeRecorder | None = None
        if opts.load_mtp:
            llc_ext.llama_set_embeddings_nextn(self._ctx, True, False)  # unmasked: every token's row
            self._hidden = np.zeros((min(n_ctx, 256), self.n_embd), dtype=np.float32)

    def _context_params(self, n_ctx: int, threads: int) -> llc.llama_context_params:
        """llama.cpp's parameters for this model's one context (n_batch, filtered_rows and the abort
        flag set first)."""
        opts = self.options
        cparams = llc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        # The defaults use 4 batch threads whatever the machine has; oversubscription halves speed.
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        if batch_invariant_cache(opts):
            cparams.type_k = cparams.type_v = GGML_TYPE_BF16
        # A verify batch's rows filtered in the graph (set_filters): without a chain attached it changes
        # nothing (llama.cpp counts and sizes only the rows of sequences that have one).
        cparams.n_outputs_max_per_seq = self.filtered_rows
        cparams.abort_callback = _ABORT_IF_SET
        cparams.abort_callback_data = ctypes.cast(self._abort_flag, ctypes.c_void_p)
        if self._recurrent:
            # llama.cpp clamps this to 0 for architectures without bounded rollback (read back as rs_seq).
            cparams.n_rs_seq = max(0, opts.max_rollback)
        return cparams

    @property
    def model_pointer(self) -> llc.llama_model_p:
        """The llama_model, for a context of another type over it (an MTP context)."""
        return self._model

    @property
    def records_hidden(self) -> bool:
        """Whether each decoded position's MTP hidden state is kept (loaded with load_mtp)."""
        return self._hidden is not None

    @property
    def context_pointer(self) -> llc.llama_context_p:
        """The llama_context, for a context that runs beside this one (ctx_other: a draft head)."""
        return self._ctx

    @property
    def abort_callback(self) -> tuple[object, ctypes.c_void_p]:
        """llama.cpp's abort callback and its data for another context that abort() stops too."""
        return _ABORT_IF_SET, ctypes.cast(self._abort_flag, ctypes.c_void_p)

    def attach_recorder(self, recorder: DecodeRecorder | None) -> None:
        """Tell `recorder` of every decode from now on (one at a time; None: none)."""
        self._recorder = recorder

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per context position (F16 keys and values, every layer), from the model's
        shape: n_layer * 2 * n_head_kv * head size * 2 bytes."""
        n_layer = llc.llama_model_n_layer(self._model)
        n_embd = llc.llama_model_n_embd(self._model)
        n_head = max(1, llc.llama_model_n_head(self._model))
        n_head_kv = llc.llama_model_n_head_kv(self._model)
        arch = self.meta("general.architecture") or ""
        head_k = _int_or(self.meta(f"{arch}.attention.key_length"), n_embd // n_head)
        head_v = _int_or(self.meta(f"{arch}.attention.value_length"), n_embd // n_head)
        return n_layer * n_head_kv * (head_k + head_v) * 2

    def _check_kv_memory(self, n_ctx: int) -> None:
        """Refuse a context whose KV cache cannot fit in memory, before llama.cpp allocates it (it
        would take gigabytes, then fail or get the process killed)."""
        available = host.available_memory()
        if available is None:
            return
        padded = -(-n_ctx // CONTEXT_PADDING) * CONTEXT_PADDING
        need = padded * self.kv_bytes_per_token()
        if need > available:
            gib = 2**30
            fits = max(0, available // max(1, self.kv_bytes_per_token()) // CONTEXT_PADDING * CONTEXT_PADDING)
            raise LlamaError(
                f"{self.path.name}: a context of {n_ctx} tokens needs {need / gib:.1f} GiB for its KV cache, "
                f"but only {available / gib:.1f} GiB of memory is available; lower --ctx "
                f"(at most about {fits} here)"
            )

    # -- facts ---------------------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def is_recurrent(self) -> bool:
        """Recurrent/hybrid models cannot drop a partial suffix of their state freely (see max_rollback)."""
        return self._recurrent

    @property
    def offloaded(self) -> bool:
        """Whether layers run on a GPU (what a verify batch costs beside one token depends on it)."""
        return self.options.n_gpu_layers != 0 and bool(llc.llama_supports_gpu_offload())

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def max_rollback(self) -> int:
        """The deepest rollback a verify round may need: a transformer's cache drops any suffix; a
        recurrent/hybrid model's state goes back at most rs_seq positions (0: not at all)."""
        return self.rs_seq if self._recurrent else self.n_ctx

    @property
    def n_layer(self) -> int:
        """Layers of the trunk (MTP layers not included)."""
        return int(llc.llama_model_n_layer(self._model))

    @property
    def n_layer_nextn(self) -> int:
        """Multi-token-prediction (MTP / NextN) layers shipped in the GGUF (0: none)."""
        return int(llc.llama_model_n_layer_nextn(self._model))

    def vocab_info(self) -> VocabInfo:
        v = self._vocab
        return VocabInfo(
            vocab_type=int(llc.llama_vocab_type(v)),
            n_tokens=self.n_vocab,
            bos=int(llc.llama_vocab_bos(v)),
            eos=int(llc.llama_vocab_eos(v)),
            add_bos=bool(llc.llama_vocab_get_add_bos(v)),
            add_eos=bool(llc.llama_vocab_get_add_eos(v)),
        )

    def token_text(self, token: int) -> bytes:
        """The vocabulary's raw text for a token (as stored in the GGUF), for vocabulary comparison."""
        return llc.llama_vocab_get_text(self._vocab, token) or b""

    def token_is_unused(self, token: int) -> bool:
        """A padding/unused vocabulary slot (LLAMA_TOKEN_ATTR_UNUSED)."""
        return bool(int(llc.llama_vocab_get_attr(self._vocab, token)) & _ATTR_UNUSED)

    def is_eog(self, token: int) -> bool:
        known = self._is_eog.get(token)
        if known is None:
            known = self._is_eog[token] = bool(llc.llama_vocab_is_eog(self._vocab, token))
        return known

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation id (EOS, EOT, <|im_end|> ...), found once by scanning the vocabulary."""
        if self._eog is None:
            self._eog = tuple(t for t in range(self.n_vocab) if llc.llama_vocab_is_eog(self._vocab, t))
        return self._eog

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llc.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def n_params(self) -> int:
        return int(llc.llama_model_n_params(self._model))

    def chat_template(self) -> str | None:
        raw = llc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # -- text ----------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                 fit: int | None = None) -> list[int]:
        """The tokens of `text`. fit: raise PromptTooLong if they would not fit a context of `fit`
        tokens, before tokenizing where the text's length alone shows it (see fewest_tokens), and
        without building the long list otherwise (a server's huge prompt costs no memory for it)."""
        data = text.encode("utf-8")
        if fit is not None and (least := self.fewest_tokens(len(data))) > fit:
            raise PromptTooLong(least, fit, exact=False)
        cap = len(data) + 16 if fit is None else min(len(data) + 16, fit + 1)
        buf = (llc.llama_token * cap)()
        n = llc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0 and fit is not None and -n > fit:
            raise PromptTooLong(-n, fit)
        if n < 0:
            cap = -n
            buf = (llc.llama_token * cap)()
            n = llc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise LlamaError("tokenization failed")
        if fit is not None:
            check_prompt_fits(n, fit)
        return list(buf[:n])

    def fewest_tokens(self, n_bytes: int) -> int:
        """A floor on the tokens of any text of `n_bytes` UTF-8 bytes: no token of a BPE or SPM
        vocabulary stands for more input bytes than its own piece (special tokens as written), so the
        text needs at least n_bytes / the longest piece. 0 for other vocabularies, whose normalisation
        (NFKC, lower-casing) can shrink the text before it is split."""
        if n_bytes <= 0 or llc.llama_vocab_type(self._vocab) not in (llc.LLAMA_VOCAB_TYPE_SPM,
                                                                     llc.LLAMA_VOCAB_TYPE_BPE):
            return 0
        if self._longest_piece is None:
            buf = ctypes.create_string_buffer(256)
            longest = 1
            for token in range(self.n_vocab):
                n = llc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
                longest = max(longest, -n if n < 0 else n)
            self._longest_piece = longest
        return -(-n_bytes // self._longest_piece)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token contributes to the output (special tokens render as nothing)."""
        piece = self._pieces.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = buf.raw[: max(n, 0)]
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # -- decoding ------------------------------------------------------------------------------------

    def abort(self) -> None:
        """Stop the decode running now (from any thread) within one graph node, and refuse every
        later one until `resume()`: they raise DecodeAborted (the CPU backend checks; a GPU decode
        runs to its end, and the next one is refused)."""
        self._abort_flag[0] = b"\x01"

    def resume(self) -> None:
        """Decode again after `abort()`."""
        self._abort_flag[0] = b"\x00"

    def decode(self, tokens: Sequence[int], *, outputs: str = "last") -> np.ndarray:
        """Evaluate `tokens` after what the cache holds and return their logits rows.

        outputs: "last" (one row), "all" (one row per token) or "none" (prompt prefill).
        The returned array is a zero-copy view of llama.cpp's buffer of shape (rows, n_vocab); it is
        valid until the next decode on this model, so callers process it before decoding again.
        """
        if self._chain is not None and outputs != "none":
            self._detach()  # with a chain attached llama.cpp leaves the raw rows stale
        rows = self._run(tokens, outputs)
        if rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return buffer_view(self._logits_views, llc.llama_get_logits(self._ctx), rows, self.n_vocab)

    def _run(self, tokens: Sequence[int], outputs: str) -> int:
        """Decode `tokens` in chunks of n_batch, outputs on the last chunk only: its output rows."""
        n = len(tokens)
        if n == 0:
            raise ValueError("decode needs at least one token")
        if self._abort_flag.raw[0]:
            raise DecodeAborted(f"{self.path.name}: decoding was stopped")
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(
                f"context full: {self.n_past} + {n} tokens exceed the context of {self.n_ctx} (raise --ctx)"
            )
        if self._recurrent and self._checkpoint is None and self.n_past > 0:
            # Once per prompt: a later rollback beyond the snapshots (a new prompt sharing a prefix,
            # a timing loop) restores this state instead of evaluating everything again.
            self.checkpoint()
        if n <= self.n_batch:
            return self._decode_chunk(tokens, outputs)
        rows = 0
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            rows = self._decode_chunk(chunk, outputs if start + len(chunk) == n else "none")
        return rows

    # -- filters in the graph (backend sampling) -----------------------------------------------------

    @property
    def filters(self) -> GraphFilters | None:
        """The filters decode_filtered applies (None: none set)."""
        return self._filters

    def set_filters(self, filters: GraphFilters | None) -> None:
        """Filter the rows of decode_filtered in llama.cpp's graph with `filters` from now on. The chain
        is attached at the next filtered decode and stays until a decode asks for raw rows: each change
        makes llama.cpp plan its graph again (about a millisecond at a 152k vocabulary)."""
        if filters == self._filters:
            return
        if self._chain is not None:
            self._detach()
        self._filters = filters

    def _attach(self) -> None:
        assert self._filters is not None and self._chain is None
        self._chain = attach_filters(self._ctx, self._filters, self.n_vocab, self.path.name)

    def _detach(self) -> None:
        chain, self._chain = self._chain, None
        detach_filters(self._ctx, chain)

    def decode_filtered(self, tokens: Sequence[int], *, outputs: str = "all") -> FilteredRows:
        """decode(), with the output rows filtered in llama.cpp's graph by the filters set
        (`set_filters`): only the survivors cross to Python. outputs: "all" or "last"; at most
        `filtered_rows` rows."""
        if self._filters is None:
            raise LlamaError("decode_filtered needs filters (set_filters)")
        if outputs == "all" and len(tokens) > self.filtered_rows:
            raise ValueError(f"at most {self.filtered_rows} filtered rows a decode, not {len(tokens)}")
        if self._chain is None:
            self._attach()
        rows = self._run(tokens, outputs)  # the last chunk's
        return filtered_output(self._ctx, rows, self.n_vocab, self._filtered_views, self.path.name,
                               argmax=self._filters.argmax)

    def _decode_chunk(self, chunk: Sequence[int], outputs: str) -> int:
        b = self._batch
        m = len(chunk)
        pos0 = len(self.tokens)
        want_all = outputs == "all"
        token, pos, logits = self._batch_arrays
        if m == 1:  # a plain round's token, a draft step
            token[0], pos[0], logits[0] = chunk[0], pos0, outputs != "none"
        else:
            for i, tok in enumerate(chunk):
                token[i] = tok
                pos[i] = pos0 + i
                logits[i] = want_all
            if outputs == "last":
                logits[m - 1] = True
        b.n_tokens = m
        self._hidden_upto = min(self._hidden_upto, pos0)  # rows from pos0 on are about to change
        if self._recorder is not None:
            self._recorder.before_decode(pos0)
        t0 = time.perf_counter()
        try:
            rc = llc.llama_decode(self._ctx, b)
            # llama_decode may return before the backend has finished (llama-bench times the two
            # together): wait here, so that decode_seconds is the model's time and not ours.
            llc.llama_synchronize(self._ctx)
            self.decode_seconds += time.perf_counter() - t0
            if rc != 0:
                # Failed decodes may leave partial ubatches in memory: drop everything past what we hold.
                # A recurrent state cannot be cut back that way: start from empty instead.
                if self._recurrent:
                    self.reset()
                else:
                    llc.llama_memory_seq_rm(self._mem, 0, pos0, -1)
                if rc == 1:
                    raise ContextFullError(f"context full: no KV slot for {m} tokens at position {pos0}")
                if rc == 2:
                    raise DecodeAborted(f"{self.path.name}: the decode was stopped")
                raise LlamaError(f"llama_decode failed with code {rc}")
            if self._hidden is not None:
                self._record_hidden(pos0, m)
            if self._recorder is not None:
                self._recorder.after_decode(pos0, m)
            self.tokens.extend(chunk)
            self._rollback_room = min(self.rs_seq, m - 1)
        except BaseException:
            self._rollback_room = 0
            self._resync(chunk, pos0)
            raise
        return m if want_all else (1 if outputs == "last" else 0)

    def _record_hidden(self, pos0: int, m: int) -> None:
        assert self._hidden is not None
        need = pos0 + m
        if need > len(self._hidden):
            grown = np.zeros((min(max(need, 2 * len(self._hidden)), self.n_ctx), self.n_embd), np.float32)
            grown[:pos0] = self._hidden[:pos0]
            self._hidden = grown
        ptr = llc_ext.llama_get_embeddings_nextn(self._ctx)
        if not ptr:
            raise LlamaError(f"{self.path.name}: llama.cpp returned no hidden state (MTP)")
        self._hidden[pos0:need] = buffer_view(self._hidden_views, ptr, m, self.n_embd)
        self._hidden_upto = need

    def hidden_rows(self, start: int, stop: int) -> np.ndarray:
        """The hidden states llama.cpp hands to MTP heads (h_nextn) at cache positions start..stop-1:
        a view, valid until the next decode. Needs load_mtp."""
        if self._hidden is None:
            raise LlamaError(f"{self.path.name}: hidden states are recorded only with load_mtp")
        if not 0 <= start <= stop <= min(self.n_past, self._hidden_upto):
            raise LlamaError(f"hidden states {start}..{stop} were not all recorded ({self.n_past} cached)")
        return self._hidden[start:stop]

    def _resync(self, chunk: Sequence[int], pos0: int) -> None:
        """Make `tokens` describe the cache again after an exception (Ctrl-C lands between any two
        bytecodes, so whether the last cache operation happened is not known): ask the cache."""
        held = llc.llama_memory_seq_pos_max(self._mem, 0) + 1
        if held < len(self.tokens):
            del self.tokens[held:]
        elif held > len(self.tokens):
            self.tokens.extend(chunk[len(self.tokens) - pos0 : held - pos0])
        self._rollback_room = 0
        if self._checkpoint is not None and held < self._checkpoint[0]:
            self._checkpoint = None
        if self._hidden is not None and held > self._hidden_upto:
            # Interrupted between a decode and recording its hidden states: an MTP drafter could
            # not read them, so the cache gives those positions up (they are evaluated again).
            if self._recurrent:
                llc.llama_memory_clear(self._mem, True)
                self.tokens.clear()
                self._checkpoint = None
            else:
                llc.llama_memory_seq_rm(self._mem, 0, self._hidden_upto, -1)
                del self.tokens[self._hidden_upto :]

    def truncate(self, n_keep: int) -> None:
        """Drop cache positions n_keep.. (a rejected draft suffix). Nothing kept is re-evaluated,
        except on a recurrent model going back to its checkpoint (see checkpoint()).

        Raises RollbackError when a recurrent/hybrid model cannot go back that far; the cache is
        then unchanged.
        """
        if n_keep >= self.n_past:
            return
        if self._recurrent:
            self._truncate_recurrent(max(n_keep, 0))
            return
        try:
            if not llc.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
                raise LlamaError(f"{self.path.name}: this model's cache cannot drop a partial suffix")
            del self.tokens[n_keep:]
        except BaseException:
            self._resync((), self.n_past)
            raise

    def can_truncate(self, n_keep: int) -> bool:
        """Whether truncate(n_keep) can go back there now."""
        if not self._recurrent or n_keep >= self.n_past:
            return True
        if n_keep == 0 or self.n_past - n_keep <= self._rollback_room:
            return True
        return self._checkpoint is not None and self._checkpoint[0] <= n_keep

    def _truncate_recurrent(self, n_keep: int) -> None:
        depth = self.n_past - n_keep
        if n_keep == 0:
            self.reset()
        elif depth <= self._rollback_room:
            # Single-use: a second rollback before the next decode would read a stale snapshot.
            self._rollback_room = 0
            try:
                ok = llc.llama_memory_seq_rm(self._mem, 0, n_keep, -1)
                if ok:  # the bookkeeping inside the try: Ctrl-C may land right after the call
                    if self._checkpoint is not None and n_keep < self._checkpoint[0]:
                        self._checkpoint = None  # the tokens before it may change from here on
                    del self.tokens[n_keep:]
            except BaseException:
                self._resync((), self.n_past)
                raise
            if not ok:
                # llama.cpp refused the snapshot rollback: never go on with a state we cannot name.
                self.reset()
                raise RollbackError(f"{self.path.name}: llama.cpp refused to roll back {depth} positions")
        elif self._checkpoint is not None and self._checkpoint[0] <= n_keep:
            self._restore_checkpoint(n_keep)
        else:
            raise RollbackError(
                f"{self.path.name}: a {self.architecture} model's recurrent state can go back "
                f"{self._rollback_room} positions here (snapshots: {self.rs_seq}), not {depth}"
            )

    def checkpoint(self) -> None:
        """Save a recurrent/hybrid model's recurrent state at the current position, so truncate()
        can return to any position from here on (restore, then re-evaluate what is kept past it).
        A no-op for other models. For draft models, whose tokens are decoded one at a time: the
        state snapshots only reach back into the last batch."""
        if not self._recurrent:
            return
        self._checkpoint = None
        flags = llc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the recurrent part; the KV part truncates
        size = llc.llama_state_seq_get_size_ext(self._ctx, 0, flags)
        buf = (ctypes.c_uint8 * size)()
        if llc.llama_state_seq_get_data_ext(self._ctx, buf, size, 0, flags) != size:
            raise LlamaError(f"{self.path.name}: could not save the recurrent state")
        self._checkpoint = (self.n_past, buf)

    def _restore_checkpoint(self, n_keep: int) -> None:
        assert self._checkpoint is not None
        pos, buf = self._checkpoint
        replay = self.tokens[pos:n_keep]
        flags = llc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        try:
            if llc.llama_state_seq_set_data_ext(self._ctx, buf, len(buf), 0, flags) != len(buf):
                raise LlamaError(f"{self.path.name}: could not restore the recurrent state")
            # The recurrent part is at pos now; drop the attention layers' cells past it too.
            llc.llama_memory_seq_rm(self._mem, 0, pos, -1)
            self._rollback_room = 0
            del self.tokens[pos:]
            if replay:
                self.decode(replay, outputs="none")
        except BaseException:
            # Interrupted between the calls, the two parts may disagree: start from empty.
            self.reset()
            raise

    def reset(self) -> None:
        self._rollback_room = 0
        self._checkpoint = None
        try:
            llc.llama_memory_clear(self._mem, True)
            self.tokens.clear()
        except BaseException:
            self._resync((), self.n_past)
            raise

    def keep_common_prefix(self, context: Sequence[int]) -> int:
        """Truncate the cache to its longest common prefix with `context[:-1]`; return that length.

        The last context token is left pending (evaluated by the next decode), so that decode can
        produce the logits that follow it.
        """
        limit = min(self.n_past, len(context) - 1)
        cached = self.tokens
        i = 0
        while i < limit and cached[i] == context[i]:
            i += 1
        if not self.can_truncate(i):
            i = 0  # a recurrent state that cannot go back that far: evaluate everything again
        self.truncate(i)
        return i

    # -- lifetime ------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._batch is not None:
            llc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llc.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_chain", None) is not None:
            llc.llama_sampler_free(self._chain)  # after the context that pointed to it
            self._chain = None
        if self._model:
            llc.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
