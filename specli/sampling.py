"""Logits -> processed distribution, keyed random draws, and the exact accept/reject rule.

The filters follow llama.cpp's default sampler order (top-k, top-p, min-p on the untempered
distribution, then temperature), so `specli --no-draft` samples what `llama-cli` would. The same
processing is applied to draft rows and target rows: exactness only needs the target's rows to be
processed exactly as plain decoding would process them, and any proposal distribution q works.

Work per row is kept off the vocabulary: one pass computes the maxima of groups of ids, and
everything after that (top-k, min-p, the top-p candidates, Gumbel-max draws) touches only the few
groups that can matter. A processed distribution (`Dist`) holds just its support. Right after a
decode has streamed the weights through the caches, every numpy call costs tens of microseconds
whatever its size, so the few dozen survivors of the filters are handled in plain Python, and
banned ids (--ignore-eos) are checked after the fact where they can only matter by winning. Where
native_sampling.c is built (specli/native.py), a top-k row is filtered and drawn there instead, in one
call each, with the same arithmetic (docs/exactness.md#the-host-filters-in-c-native_samplingc).

Randomness is keyed, not streamed: every random number is a hash of (seed, position, purpose, token
id) (`Noise`), so what a position draws never depends on what was drawn before, how many tokens a
round drafted, or how long anything took. Tokens are drawn by the Gumbel-max trick, argmax(log p +
g): with the same noise at a position, a draft that draws from q and the target that draws from p
agree exactly when the draft guessed the target's own draw (drafter-invariant speculative sampling,
Daliri, Musco & Suresh 2024), which is what `--same-as-plain` verifies.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from specli.native import FilterSettings, NativeSampling, data_address, native
from specli.settings import DEFAULTS, SAMPLER_RANGES, SETTINGS, RunSettings, temperature_problem

# Ids are grouped in fixed blocks of this many: a block's maximum logit bounds all of its ids.
BLOCK = 256
_LOG_BLOCK = math.log(BLOCK)


class SamplingError(ValueError):
    """Logits or settings that cannot give a distribution (NaN/inf logits, nothing left to sample)."""


@dataclass(frozen=True)
class SamplingParams:
    """The sampler of one generation. Its defaults are the plain sampler (the default temperature, every
    filter off: specli.settings.SETTINGS' `off`); the commands' defaults (llama.cpp's filters) are
    RunSettings', from which `of` builds these for every front end."""

    temperature: float = DEFAULTS.temp
    top_k: int = SETTINGS["top_k"].off
    top_p: float = SETTINGS["top_p"].off
    min_p: float = SETTINGS["min_p"].off
    banned: tuple[int, ...] = ()  # ids that are never sampled (--ignore-eos bans end-of-generation)

    def __post_init__(self) -> None:
        for name, rule in SAMPLER_RANGES.items():
            value = getattr(self, name)
            if not rule.valid(value):
                raise ValueError(f"{name} must be {rule.expected}, got {value}")
        if (problem := temperature_problem(self.temperature)) is not None:
            raise ValueError(f"temperature {problem}")

    @classmethod
    def of(cls, settings: RunSettings) -> SamplingParams:
        """The sampler of a run with these settings."""
        return cls(temperature=settings.temp, top_k=settings.top_k, top_p=settings.top_p,
                   min_p=settings.min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @functools.cached_property
    def unbanned(self) -> SamplingParams:
        """The same settings for rows whose banned ids are already at -inf (see mask_banned)."""
        return replace(self, banned=()) if self.banned else self


# The figures to quote as "default sampling" (lab's comparisons): the commands' sampler.
DEFAULT_SAMPLING = SamplingParams.of(DEFAULTS)


_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
_F64 = np.dtype(np.float64)


# -- keyed noise ---------------------------------------------------------------------------------------

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix_int(x: int) -> int:
    """splitmix64's finalizer on a Python int: every output bit depends on every input bit."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """The same finalizer over a uint64 array (array arithmetic wraps silently, as intended)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_FACTORS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_GOLDEN_U64 = np.uint64(_GOLDEN)


def _mix_in_place(x: np.ndarray) -> None:
    """_mix, overwriting x (a uint64 array): the same values, without a new array per step."""
    s30, s27, s31 = _SHIFTS
    t = x >> s30
    x ^= t
    x *= _FACTORS[0]
    np.right_shift(x, s27, out=t)
    x ^= t
    x *= _FACTORS[1]
    np.right_shift(x, s31, out=t)
    x ^= t


_2_53 = 1.0 / (1 << 53)  # 53 bits of a hash, as a uniform's step (_unit, Noise.gumbel_few)
# Supports of up to this many ids draw their noise in plain Python (Noise.gumbel_few) where
# native_sampling.c is not built; with it, every support draws there, with the same arithmetic (the C
# library's log). Above this, numpy's vectorized log can differ from it in the last bit: a draw then
# differs only where two candidates tie to ~1e-16, and one process always uses one of the two.
_FEW = 64


def _unit(bits: np.ndarray) -> np.ndarray:
    """Uniforms in the open interval (0, 1) from 53 of the bits."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * _2_53


# What a random number is for: independent families, so no draw is ever reused for another purpose.
CHOICE = 0  # the target's own draw at a position (plain, bonus; the draft's too with --same-as-plain)
RESIDUAL = 1  # the draw after a rejection, from norm(max(p - q, 0))
DRAFT = 2  # the draft's draw in rejection-sampling mode (salted by the attempt)
ACCEPT = 3  # the uniform of the accept/reject test


class Noise:
    """Random numbers keyed by (seed, position, family, salt, token id): counter-based, so the same
    key gives the same number in every run whatever else was drawn (a hash, not a stream).

    Draws over a filtered support (top-k, top-p, min-p: a few dozen ids) hash each id. Draws over
    the whole vocabulary use noise built top-down by blocks of `BLOCK` ids (the block's maximum,
    which of its ids holds it, the others truncated below it; exactly i.i.d. Gumbel(0) per id), so
    they need the noise of the few blocks whose logits can win, not of every id. A distribution's
    support kind depends only on the settings, so the target and the draft, and plain and
    speculative decoding, always draw with the same kind.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._key = _mix_int(self.seed ^ _GOLDEN)

    def _base(self, position: int, stream: int, salt: int) -> int:
        h = _mix_int(self._key ^ (position * _GOLDEN))
        h = _mix_int(h ^ ((stream << 48) + 1))
        return _mix_int(h ^ (salt * 0xD6E8FEB86659FD93))

    def _bits(self, position: int, stream: int, salt: int, ids: np.ndarray) -> np.ndarray:
        base = np.uint64(self._base(position, stream, salt))
        return _mix(ids.astype(np.uint64) * np.uint64(_GOLDEN) + base)

    def uniform(self, position: int, family: int, salt: int = 0) -> float:
        return float(_unit(self._bits(position, family * 4, salt, np.zeros(1, dtype=np.int64)))[0])

    def block_gumbel(self, position: int, blocks: np.ndarray, family: int, salt: int = 0) -> np.ndarray:
        """Each block's largest per-id Gumbel: Gumbel(log BLOCK)."""
        u = _unit(self._bits(position, family * 4 + 1, salt, blocks))
        return _LOG_BLOCK - np.log(-np.log(u))

    def gumbel(self, position: int, ids: np.ndarray, family: int, salt: int = 0) -> np.ndarray:
        """Gumbel(0) noise of each id (float64): one hash per id, for draws over a small support."""
        lib = native()
        if lib is not None:
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            out = np.empty(ids.shape[0])
            lib.keyed_gumbel(data_address(ids), ids.shape[0], self._base(position, family * 4, salt),
                             data_address(out))
            return out
        if ids.shape[0] <= _FEW:
            return np.array(self.gumbel_few(position, ids.tolist(), family, salt))
        # -log(-log(_unit(_bits(...)))), each step in place (the same arithmetic, fewer arrays)
        x = ids.astype(np.uint64)
        x *= _GOLDEN_U64
        x += np.uint64(self._base(position, family * 4, salt))
        _mix_in_place(x)
        x >>= np.uint64(11)
        g = x.astype(np.float64)
        g += 0.5
        g *= _2_53
        np.log(g, out=g)
        np.negative(g, out=g)
        np.log(g, out=g)
        np.negative(g, out=g)
        return g

    def gumbel_few(self, position: int, ids: list[int], family: int, salt: int = 0) -> list[float]:
        """gumbel() for a few ids in plain Python: right after a decode has evicted the caches, each
        numpy call costs tens of microseconds, and a draw from a filtered support needs a dozen."""
        base = self._base(position, family * 4, salt)
        log = math.log
        return [-log(-log(((_mix_int(i * _GOLDEN + base) >> 11) + 0.5) * _2_53)) for i in ids]

    def gumbel_blocked(self, position: int, ids: np.ndarray, family: int, salt: int = 0) -> np.ndarray:
        """Another Gumbel(0) noise per id, built top-down by blocks (see the class docstring), for
        draws over the whole vocabulary; the same whichever ids are asked for together."""
        n = ids.shape[0]
        blocks = ids // BLOCK
        # One hash pass over three keys per id: its own draw, its block's maximum, the block's holder.
        keys = np.concatenate([ids, blocks, blocks]).astype(np.uint64) * np.uint64(_GOLDEN)
        keys[:n] += np.uint64(self._base(position, family * 4 + 3, salt))
        keys[n : 2 * n] += np.uint64(self._base(position, family * 4 + 1, salt))
        keys[2 * n :] += np.uint64(self._base(position, family * 4 + 2, salt))
        bits = _mix(keys)
        g = -np.log(-np.log(_unit(bits[: 2 * n])))
        own, top = g[:n], g[n:] + _LOG_BLOCK
        # Truncated below the block's maximum: -log(e^-top + e^-own) is Gumbel conditioned <= top.
        out = -np.log(np.exp(-top) + np.exp(-own))
        is_holder = (ids % BLOCK).astype(np.uint64) == bits[2 * n :] % np.uint64(BLOCK)
        out[is_holder] = top[is_holder]
        return out


# -- processed distributions ---------------------------------------------------------------------------


def _block_max(row: np.ndarray) -> np.ndarray:
    """The maximum of each block of BLOCK consecutive ids (the blocks the noise is built on)."""
    n = row.shape[0]
    full = n - n % BLOCK
    bm = row[:full].reshape(-1, BLOCK).max(axis=1)
    if full < n:
        bm = np.append(bm, row[full:].max())
    return bm


class _Groups:
    """The row's ids in strided groups (group c: c, c + stride, c + 2·stride, …; the few ids past
    the last full row join groups 0, 1, …) and each group's maximum. One pass over the row computes
    all maxima (an elementwise max of `rows` contiguous slices, which vectorizes far better than
    per-block reductions); a search then touches only the groups whose maximum can matter."""

    _ROWS = 32

    def __init__(self, row: np.ndarray) -> None:
        n = row.shape[0]
        self.rows = self._ROWS if n >= self._ROWS * 64 else 1
        self.stride = n // self.rows
        main = self.rows * self.stride
        gm = row[:main].reshape(self.rows, self.stride).max(axis=0)
        self.tail = n - main
        if self.tail:
            np.maximum(gm[: self.tail], row[main:], out=gm[: self.tail])
        self.max = gm

    def ids(self, groups: np.ndarray) -> np.ndarray:
        """The ids of `groups`; in ascending order when `groups` ascend (row by row)."""
        ids = (_row_offsets(self.rows, self.stride) + groups).ravel()
        if self.tail:
            ids = np.concatenate([ids, self.rows * self.stride + groups[groups < self.tail]])
        return ids


@functools.lru_cache(maxsize=8)
def _row_offsets(rows: int, stride: int) -> np.ndarray:
    return (np.arange(rows, dtype=np.int64) * stride)[:, None]


def _sorted_desc(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ids by logit, best first; ties to the lowest id (deterministic, as llama.cpp's sort)."""
    return ids[np.lexsort((ids, -row[ids]))]


def _top_k(row: np.ndarray, groups: _Groups, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids of the `k` largest logits (ties to the lowest ids, deterministic as llama.cpp's sort)
    and their logits, by ascending id.

    The k-th largest group maximum t is a value of the row, and k groups reach it, so the k-th largest
    value is >= t: every id that can be among the top lies in a group whose maximum reaches t, and
    only those groups are gathered (about k of them).
    """
    n = row.shape[0]
    gm = groups.max
    if k >= gm.shape[0] or k * groups.rows * 4 >= n:
        ids = np.arange(n)
    else:
        ids = groups.ids((gm >= _kth_largest(gm, k)).nonzero()[0])
    vals = row[ids]
    if k < ids.shape[0]:
        top = (vals >= _kth_largest(vals, k)).nonzero()[0]
        if top.shape[0] > k:
            top = np.sort(np.lexsort((ids, -vals))[:k])  # a tie at the boundary: the lowest ids win it
        ids, vals = ids[top], vals[top]
    return ids, vals


def _kth_largest(values: np.ndarray, k: int) -> np.floating:
    """The k-th largest of `values`. Array methods rather than np.partition and np.flatnonzero here:
    their Python wrappers cost more than the work on a few thousand values right after a decode."""
    part = values.copy()
    part.partition(values.shape[0] - k)
    return part[values.shape[0] - k]


def _top_ids(row: np.ndarray, groups: _Groups, width: int) -> np.ndarray:
    """The `width` largest logits' ids, best first (ties to the lowest id)."""
    ids, vals = _top_k(row, groups, width)
    return ids[np.lexsort((ids, -vals))]


def _at_least(row: np.ndarray, groups: _Groups, floor: float) -> np.ndarray:
    """Ids whose logit is >= floor, best first, searching only the groups that reach it."""
    ids = groups.ids(np.flatnonzero(groups.max >= floor))
    return _sorted_desc(row, ids[row[ids] >= floor])


# Relative margin within which the top-p fast path defers to the sorted cumulative sum: far above the
# rounding of a sum of a few dozen float64 terms, so both ways give the same cut.
_TOP_P_MARGIN = 1e-9


def _top_p_length(cum: np.ndarray, top_p: float) -> int:
    """How many of the best-first candidates top-p keeps, given their cumulative mass: the smallest
    prefix whose mass reaches top_p (at least one token, at most all), as llama.cpp does."""
    cut = int(np.searchsorted(cum, top_p, side="left")) + 1
    return max(1, min(cut, cum.shape[0]))


class _MaskFirst(Exception):
    """A banned id is among the top k whose mass top-p normalises by: mask the row, then filter."""


def _top_k_support(
    row: np.ndarray,
    groups: _Groups,
    m: float,
    top_k: int,
    top_p: float,
    floor: float,
    banned: frozenset[int] = frozenset(),
) -> tuple[np.ndarray, np.ndarray]:
    """top-k, then top-p over the survivors' mass (0: off), then min-p (floor: -inf when off).

    The survivors of min-p are the largest of the top k, so they come first in the sorted order that
    top-p cuts: when the top-k mass without the smallest min-p survivor stays below top_p, top-p
    keeps every min-p survivor and nothing needs sorting (the usual case, most often decided from
    the survivors alone, before the top k are ranked). Otherwise the cut is taken from the sorted
    cumulative sum, exactly as llama.cpp computes it. The few dozen values are handled in plain
    Python: after a decode each numpy call costs more than its arithmetic.

    `banned`: ids the row was not masked for (see distribution). A banned id among the top k would
    count in the mass top-p normalises by, so then _MaskFirst. Deciding from min-p's survivors is
    unaffected (their own mass bounds the top-k mass from below, banned ids in it or not).
    """
    if floor != -math.inf and _floor_hint.worth_trying():
        found = _within_floor(row, groups, m, top_k, top_p, floor)
        _floor_hint.record(found is not None)
        if found is not None:
            return found
    keep, vals = _top_k(row, groups, top_k)
    if top_p and banned and not banned.isdisjoint(keep.tolist()):
        raise _MaskFirst
    if not top_p:
        if floor == -math.inf:
            return keep, vals
        survives = vals >= floor
        return keep[survives], vals[survives]
    values = vals.tolist()
    exp = math.exp
    z = [exp(v - m) for v in values]
    total = sum(z)
    z_survivors = [zi for zi, v in zip(z, values, strict=True) if v >= floor]
    if sum(z_survivors) - min(z_survivors) < top_p * total * (1 - _TOP_P_MARGIN):
        if len(z_survivors) == len(values):
            return keep, vals
        survives = vals >= floor
        return keep[survives], vals[survives]
    # The smallest best-first prefix whose mass reaches top_p (ties to the lowest id), summed in order
    # as llama.cpp sums it (in float64; the total too, best first, as native_sampling.c does), then
    # min-p's floor; the survivors by ascending id.
    order = np.lexsort((keep, -vals)).tolist()
    total = 0.0
    for i in order:
        total += z[i]
    mass, cut = 0.0, len(order)
    for j, i in enumerate(order):
        mass += z[i]
        if mass / total >= top_p:
            cut = j + 1
            break
    prefix = sorted(i for i in order[:cut] if values[i] >= floor)
    return keep[prefix], vals[prefix]


class _FloorHint:
    """Whether _within_floor is worth trying on the next row: it decides most rows of a peaked model
    alone, but on flat rows (top-p cutting inside min-p's survivors) it fails after doing most of the
    work, and the ranked top k is needed anyway. After two failures in a row it is tried only every
    RETRY rows, until it decides one again. Speed only: both ways give the same support."""

    RETRY = 8

    def __init__(self) -> None:
        self._failed = 0  # consecutive failures
        self._skip = 0

    def worth_trying(self) -> bool:
        if self._skip:
            self._skip -= 1
            return False
        return True

    def record(self, decided: bool) -> None:
        self._failed = 0 if decided else self._failed + 1
        self._skip = self.RETRY - 1 if self._failed >= 2 else 0


_floor_hint = _FloorHint()


def _within_floor(
    row: np.ndarray, groups: _Groups, m: float, top_k: int, top_p: float, floor: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """top-k → top-p → min-p decided from min-p's survivors alone, when they suffice (most rows):
    the ids >= floor, found in the few groups that reach it, without ranking the top k first.

    When there are at most top_k of them they are the best of the top k; top-p then keeps them all
    if the mass of all but the smallest stays below top_p of the top-k mass, of which their own mass
    is a lower bound. One survivor always stays (top-p keeps at least one token). None: undecided.
    """
    reaching = (groups.max >= floor).nonzero()[0]
    if reaching.shape[0] > top_k:  # each such group holds a survivor: more than top_k of them
        return None
    near = groups.ids(reaching)
    vals = row[near]
    survivors = (vals >= floor).nonzero()[0]
    if survivors.shape[0] > top_k:
        return None
    keep, kept = near[survivors], vals[survivors]
    if keep.shape[0] == 1 or not top_p:
        return keep, kept
    exp = math.exp
    z = [exp(v - m) for v in kept.tolist()]
    mass = sum(z)
    if mass - min(z) < top_p * mass * (1 - _TOP_P_MARGIN):
        return keep, kept
    return None


def _min_p_floor(m: float, min_p: float) -> float:
    """min-p's floor, m + log(min_p), rounded to a float32 once: numpy compares float32 logits with a
    Python float in float32 and Python compares in float64, and the two agree only on a float32."""
    return float(np.float32(m + math.log(min_p)))


def _unfiltered(params: SamplingParams, n: int) -> bool:
    """Whether no filter narrows a row of n ids (top-k at 0 or n and above, top-p at 1, min-p at 0)."""
    return not (0 < params.top_k < n or params.top_p < 1.0 or params.min_p)


def _support(
    row: np.ndarray, groups: _Groups, m: float, params: SamplingParams, banned: frozenset[int]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The token ids surviving top-k/top-p/min-p (in no particular order) and their logits, or None
    when no filter is active (all)."""
    n = row.shape[0]
    if _unfiltered(params, n):
        return None
    top_k = params.top_k if 0 < params.top_k < n else 0
    top_p = params.top_p if params.top_p < 1.0 else 0.0
    min_p = params.min_p
    floor = _min_p_floor(m, min_p) if min_p else -math.inf
    if top_k:
        return _top_k_support(row, groups, m, top_k, top_p, floor, banned)
    if not top_p:
        keep = _at_least(row, groups, floor)  # min-p alone: keep p >= min_p * p_max
        return keep, row[keep]
    # top-p over the whole row's mass, as llama.cpp. float64: the cut must not move with rounding
    # when the mass sits right at top_p.
    total = float(np.exp(row.astype(np.float64) - m).sum())
    width = 64
    while True:
        keep = _top_ids(row, groups, width)
        cum = np.cumsum(np.exp(row[keep].astype(np.float64) - m)) / total
        if cum[-1] >= top_p or width >= n:
            break
        width = min(n, width * 8)
    keep = keep[: _top_p_length(cum, top_p)]
    if min_p:
        keep = keep[row[keep] >= floor]
    return keep, row[keep]


class Dist:
    """A processed distribution over a vocabulary of `width` ids: its support `ids` (None: every id)
    and their `scores`, the tempered logits (log-probabilities up to a constant). Probabilities are
    computed when first asked for."""

    __slots__ = ("ids", "scores", "width", "_probs", "_block_max", "_at")

    def __init__(
        self, ids: np.ndarray | None, scores: np.ndarray, width: int, block_max: np.ndarray | None = None,
        at: tuple[int, int] | None = None,
    ) -> None:
        self.ids = ids
        self.scores = scores
        self.width = width
        self._probs: np.ndarray | None = None
        self._block_max = block_max  # dense only: each block's largest score
        self._at = at  # where ids (int64) and scores (float64) live, for native_sampling.c

    @staticmethod
    def from_probs(ids: np.ndarray | None, probs: np.ndarray, width: int) -> Dist:
        with np.errstate(divide="ignore"):
            d = Dist(ids, np.log(probs), width)
        d._probs = probs / probs.sum()
        return d

    @property
    def probs(self) -> np.ndarray:
        """Probabilities over the support (float64, summing to 1)."""
        if self._probs is None:
            z = np.exp(self.scores - self.scores.max(), dtype=np.float64)
            self._probs = z / z.sum()
        return self._probs

    def prob(self, token: int) -> float:
        if self.ids is None:
            return float(self.probs[token]) if 0 <= token < self.scores.shape[0] else 0.0
        hit = (self.ids == token).nonzero()[0]
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def top(self) -> float:
        """The largest probability (how sure this distribution is)."""
        return float(self.probs.max())

    def dense(self) -> np.ndarray:
        """The probability row over the whole vocabulary (float32)."""
        out = np.zeros(self.width, dtype=np.float32)
        if self.ids is None:
            out[: self.probs.shape[0]] = self.probs
        else:
            out[self.ids] = self.probs
        return out

    def draw(self, noise: Noise, position: int, family: int = CHOICE, salt: int = 0) -> int:
        """The Gumbel-max draw argmax(score + g) with the noise keyed at this position: a sample of
        this distribution, and the same token for every distribution that agrees on where it lands."""
        if self.ids is not None:
            if self.ids.shape[0] == 1:
                return int(self.ids[0])  # the argmax over one id, whatever its noise
            lib = native()
            if lib is not None:
                at = self._at
                if at is None and self.ids.dtype == _I64 and self.scores.dtype == _F64 \
                        and self.ids.flags.c_contiguous and self.scores.flags.c_contiguous:
                    at = self._at = (data_address(self.ids), data_address(self.scores))
                if at is not None:
                    return int(self.ids[lib.keyed_argmax(at[0], at[1], self.ids.shape[0], noise._key,
                                                         position, family * 4, salt)])
            if self.ids.shape[0] <= _FEW:
                ids = self.ids.tolist()
                noise_of = noise.gumbel_few(position, ids, family, salt)
                values = [s + g for s, g in zip(self.scores.tolist(), noise_of, strict=True)]
                return ids[values.index(max(values))]
            return int(self.ids[np.argmax(self.scores + noise.gumbel(position, self.ids, family, salt))])
        s = self.scores
        if self._block_max is None:
            self._block_max = _block_max(s)
        lib = native()
        if lib is not None and s.dtype == _F32 and self._block_max.dtype == _F32 and s.flags.c_contiguous:
            token = lib.dense_draw(data_address(s), s.shape[0], data_address(self._block_max), noise._key,
                                   position, family * 4, salt)
            if token == -1:
                raise SamplingError("nothing left to sample: the distribution has no mass")
            if token >= 0:
                return token
        n_blocks = self._block_max.shape[0]
        bound = self._block_max + noise.block_gumbel(position, np.arange(n_blocks), family, salt)
        # The top-scoring id's own value is a floor for the winner's: only blocks whose bound (their
        # best score plus their largest noise) beats it can hold the winner. All of them are
        # evaluated at once; usually a handful.
        top = int(np.argmax(s))
        floor = float(s[top] + noise.gumbel_blocked(position, np.array([top]), family, salt)[0])
        blocks = np.flatnonzero(bound >= floor)
        if not math.isfinite(floor) or blocks.shape[0] == 0:
            raise SamplingError("nothing left to sample: the distribution has no mass")
        ids = (blocks[:, None] * BLOCK + np.arange(BLOCK)).ravel()
        ids = ids[ids < s.shape[0]]
        values = s[ids] + noise.gumbel_blocked(position, ids, family, salt)
        return int(ids[np.argmax(values)])

    def _aligned(self, other: Dist) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """(ids, p, q): both distributions' probabilities over the union of their supports."""
        if self.ids is None or other.ids is None:
            return None, _dense64(self), _dense64(other)
        ids = np.union1d(self.ids, other.ids)
        p = np.zeros(ids.shape[0])
        q = np.zeros(ids.shape[0])
        p[np.searchsorted(ids, self.ids)] = self.probs
        q[np.searchsorted(ids, other.ids)] = other.probs
        return ids, p, q

    def overlap(self, q: Dist) -> float:
        """sum_x min(p(x), q(x)): how likely the exact rule accepts a proposal drawn from q."""
        _, p_row, q_row = self._aligned(q)
        return float(np.minimum(p_row, q_row).sum())

    def residual(self, q: Dist | None, rejected_token: int) -> Dist:
        """norm(max(p - q, 0)): what to draw after a rejection so that the output still follows p.
        q None is a point-mass proposal (n-gram lookup): p with the rejected token removed."""
        if q is None:
            ids, r = self.ids, self.probs.copy()
            hit = np.flatnonzero(ids == rejected_token) if ids is not None else [rejected_token]
            r[hit] = 0.0
        else:
            ids, p_row, q_row = self._aligned(q)
            r = np.maximum(p_row - q_row, 0.0)
        if not r.sum() > 0:
            return self  # only reachable through float rounding when p == q: then p is the answer
        return Dist.from_probs(ids, r, self.width)


def _dense64(d: Dist) -> np.ndarray:
    out = np.zeros(d.width)
    if d.ids is None:
        out[: d.probs.shape[0]] = d.probs
    else:
        out[d.ids] = d.probs
    return out


@functools.lru_cache(maxsize=16)
def _banned_index(banned: tuple[int, ...], n: int) -> np.ndarray:
    return np.array(sorted({t for t in banned if 0 <= t < n}), dtype=np.int64)


def _without_banned(row: np.ndarray, banned: tuple[int, ...]) -> np.ndarray:
    """The row with banned ids at -inf; a copy only when one of them is not already there (rows
    that need it are masked in place first, by masked_for, so the usual case copies nothing)."""
    if not banned:
        return row
    idx = _banned_index(banned, row.shape[0])
    if not idx.size or not (row[idx] > -np.inf).any():
        return row
    row = row.copy()
    row[idx] = -np.inf
    return row


def mask_banned(rows: np.ndarray, banned: tuple[int, ...]) -> None:
    """Set banned ids to -inf in place, in llama.cpp's logits buffer (ours until the next decode)."""
    for token in _banned_index(banned, rows.shape[1]).tolist():
        rows[:, token] = -np.inf  # one column at a time: cheaper than a fancy-index store for a few ids


def _checks_banned_after(params: SamplingParams) -> bool:
    """Whether sampling with `params` looks at banned ids only after the fact (greedy, top-k): a
    banned id changes the outcome only when it is among the winners (with top-p: among the top k,
    whose mass top-p normalises by), which is rare and cheap to check, so rows need not be masked
    first."""
    return params.greedy or params.top_k > 0


def masked_for(rows: np.ndarray, params: SamplingParams) -> SamplingParams:
    """Get target rows ready for sampling with `params`: banned ids are masked in place unless the
    sampling checks them after the fact; returns the settings to sample these rows with."""
    if not params.banned or _checks_banned_after(params):
        return params
    mask_banned(rows, params.banned)
    return params.unbanned


def _check_max(m: float) -> None:
    if math.isnan(m) or m == math.inf:
        raise SamplingError("the model produced NaN or infinite logits; refusing to sample from them")
    if m == -math.inf:
        raise SamplingError("nothing left to sample: the distribution has no mass")


class Survivors:
    """A row filtered in llama.cpp's graph (backend sampling, llama.GraphFilters): the ids that survived
    top-k, top-p and min-p (banned ids never do), in llama.cpp's order, and their untempered logits.
    `distribution`, `greedy_token` and `top_probability` take one where they take a row."""

    __slots__ = ("ids", "logits")

    def __init__(self, ids: np.ndarray, logits: np.ndarray) -> None:
        self.ids, self.logits = ids, logits


def _survivors_distribution(s: Survivors, params: SamplingParams, out_width: int) -> Dist:
    """The survivors tempered as `_distribution` tempers its own (float64, the same values): a row whose
    survivors agree with the host's filters gives the same Dist, and so the same keyed draws."""
    if s.ids.shape[0] == 0:
        raise SamplingError("nothing left to sample: the distribution has no mass")
    m = float(s.logits.max())
    _check_max(m)
    inv_t = 1.0 / params.temperature
    if not math.isfinite(inv_t * max(1.0, abs(m))):
        raise SamplingError(f"temperature {params.temperature:g} is too small to divide logits by")
    return Dist(s.ids.astype(np.intp), np.multiply(s.logits, inv_t, dtype=np.float64), out_width)


def _survivors_best(s: Survivors) -> int:
    """The best survivor; ties to the lowest id (llama.cpp's order is not by id)."""
    values = s.logits.tolist()
    best = max(values)
    _check_max(best)
    ids = s.ids.tolist()
    return min(ids[i] for i, v in enumerate(values) if v == best)


def checked_token(token: int, logit: float) -> int:
    """A row's best id as llama.cpp's graph found it (its argmax: llama.GraphFilters.argmax), its logit
    checked as greedy_token checks the row's maximum."""
    _check_max(logit)
    return token


def greedy_token(logits: np.ndarray | Survivors, banned: tuple[int, ...] = ()) -> int:
    """argmax of one row (ties go to the lowest id, as llama.cpp's greedy sampler). One pass: argmax
    lands on a NaN if there is one, so checking the winner checks the row. Survivors: their best
    (llama.cpp's graph left banned ids out)."""
    if isinstance(logits, Survivors):
        return _survivors_best(logits)
    idx = int(logits.argmax())
    if banned and idx in banned:  # rare: only then is a masked copy of the row needed
        logits = _without_banned(logits, banned)
        idx = int(logits.argmax())
    _check_max(float(logits[idx]))
    return idx


def top_probability(row: np.ndarray | Survivors) -> float:
    """max softmax(row), the draft's confidence in its greedy token, from the ids that can matter: the
    64 groups with the highest maxima, within 20 nats of the top (Survivors: over the survivors). Any
    function of the row keeps sampling exact (it never looks at a drawn token); this one errs only on
    very flat rows, where it overstates a confidence that is low either way."""
    if isinstance(row, Survivors):
        m = float(row.logits.max())
        _check_max(m)
        return float(1.0 / np.exp(row.logits.astype(np.float64) - m).sum())
    groups = _Groups(row)
    gm = groups.max
    m = float(gm.max())
    _check_max(m)
    near = np.flatnonzero(gm >= m - 20.0)
    if near.shape[0] > 64:
        near = near[np.argpartition(gm[near], near.shape[0] - 64)[-64:]]
    ids = groups.ids(near)
    return float(1.0 / np.exp(row[ids].astype(np.float64) - m).sum())


def distribution(logits: np.ndarray | Survivors, params: SamplingParams, *, width: int | None = None) -> Dist:
    """One logits row -> the processed distribution that sampling draws from.

    `width` is the target's vocabulary size: ids beyond it (a draft with a longer vocabulary) are
    never proposed, and a shorter row simply has no mass past its end. Banned ids need not be
    masked in the row (see masked_for). Survivors (a row llama.cpp's graph filtered with these
    settings): tempered only; their ids are below `width`.
    """
    if params.greedy:
        raise ValueError("greedy decoding uses greedy_token, not a distribution")
    if isinstance(logits, Survivors):
        return _survivors_distribution(logits, params, width or int(logits.ids.max(initial=0)) + 1)
    row = logits if width is None or width >= logits.shape[0] else logits[:width]
    out_width = width or row.shape[0]
    lib = native()
    if _filters_in_c(lib, row, params):
        dist = _native_distribution(lib, row, params, out_width)
        if dist is not None:
            return dist
    if params.banned:
        if 0 < params.top_k < row.shape[0]:
            # A banned id changes top-k's outcome only by being among the winners (or, with top-p,
            # among the top k: _MaskFirst): check afterwards.
            try:
                banned = _banned_set(params.banned)
                dist = _distribution(row, params.unbanned, out_width, banned)
                if banned.isdisjoint(dist.ids.tolist()):
                    return dist
            except (_MaskFirst, SamplingError):
                pass  # a banned id counts in top-p's mass, or its NaN or infinity: use the masked row
        row = _without_banned(row, params.banned)
    return _distribution(row, params.unbanned, out_width)


def _filters_in_c(lib: NativeSampling | None, row: np.ndarray, params: SamplingParams) -> bool:
    """Whether native_sampling.c filters `row` with `params` (a top-k short of the row, a contiguous
    float32 row, the C filters built and vectorized here)."""
    return lib is not None and lib.filter is not None and 0 < params.top_k < row.shape[0] \
        and row.dtype == _F32 and row.flags.c_contiguous


def plain_token(rows: np.ndarray, params: SamplingParams, noise: Noise, position: int) -> int:
    """Row 0's token at `position` in a round with nothing drafted: distribution(row).draw(noise,
    position) (rows masked first where `masked_for` masks them), in one call of native_sampling.c
    where it filters the row: the same survivors and keyed draw, so the same token. Right after a
    decode each Python step costs several times what it costs warm, and a Dist nothing will read is
    a dozen of them."""
    row = rows[0]
    lib = native()
    if _filters_in_c(lib, row, params):
        out = np.empty(4 * params.top_k + 1)
        token = lib.filter_draw(data_address(row), row.shape[0], _filter_settings(params)[1],
                                data_address(out), noise._key, position, CHOICE * 4, 0)
        if token >= 0:
            return token
    return distribution(rows[0], masked_for(rows, params)).draw(noise, position)


@functools.lru_cache(maxsize=16)
def _banned_set(banned: tuple[int, ...]) -> frozenset[int]:
    return frozenset(banned)


def _distribution(
    row: np.ndarray, params: SamplingParams, out_width: int, banned: frozenset[int] = frozenset()
) -> Dist:
    if _unfiltered(params, row.shape[0]) and row.dtype == _F32 and row.flags.c_contiguous:
        lib = native()
        if lib is not None:
            dist = _native_dense(lib, row, params, out_width)
            if dist is not None:
                return dist
    groups = _Groups(row)
    m = float(groups.max.max())
    _check_max(m)
    inv_t = 1.0 / params.temperature
    if not math.isfinite(inv_t * max(1.0, abs(m))):
        raise SamplingError(f"temperature {params.temperature:g} is too small to divide logits by")
    support = _support(row, groups, m, params, banned)
    if support is None:
        return Dist(None, row * np.float32(inv_t), out_width)
    keep, logits_kept = support
    return Dist(keep, np.multiply(logits_kept, inv_t, dtype=np.float64), out_width)


def _native_dense(
    lib: NativeSampling, row: np.ndarray, params: SamplingParams, out_width: int
) -> Dist | None:
    """The whole row tempered, and its blocks' maxima for the draw, in one pass of native_sampling.c:
    the scores numpy's `row * np.float32(inv_t)` gives. None where the numpy path must decide (a NaN or
    infinite logit, a row with no mass, a temperature too small: its errors)."""
    n = row.shape[0]
    scores = np.empty(n, dtype=_F32)
    block_max = np.empty(-(-n // BLOCK), dtype=_F32)
    inv_t = 1.0 / params.temperature
    m = lib.dense_scores(data_address(row), n, inv_t, data_address(scores), data_address(block_max))
    if not math.isfinite(m) or not math.isfinite(inv_t * max(1.0, abs(m))):
        return None
    return Dist(None, scores, out_width, block_max)


def _filter_settings(params: SamplingParams) -> tuple[FilterSettings, int, np.ndarray | None]:
    """native_sampling.c's settings for `params`, where they live, and the banned ids they point to
    (the caller holds the tuple during the call). A generation passes one SamplingParams object for
    every row: it is recognised by identity first (hashing the dataclass costs ~1 µs)."""
    global _last_settings
    last = _last_settings  # one tuple, swapped whole: a thread never reads half of another's pair
    if last[0] is params:
        return last[1]
    made = _settings_for(params)
    _last_settings = (params, made)
    return made


_last_settings: tuple = (None, None)


@functools.lru_cache(maxsize=16)
def _settings_for(params: SamplingParams) -> tuple[FilterSettings, int, np.ndarray | None]:
    banned = np.array(params.banned, dtype=np.int64) if params.banned else None
    settings = FilterSettings(params.top_k, params.top_p if params.top_p < 1.0 else 0.0, params.min_p,
                              1.0 / params.temperature, len(params.banned),
                              None if banned is None else data_address(banned))
    return settings, ctypes.addressof(settings), banned


def _native_distribution(
    lib: NativeSampling, row: np.ndarray, params: SamplingParams, out_width: int
) -> Dist | None:
    """top-k → top-p → min-p in one call of native_sampling.c, banned ids masked: the same support,
    scores and order (ascending ids) as the numpy path. None where that path must decide (a NaN or
    infinite logit: its errors)."""
    k = params.top_k
    out = np.empty(4 * k + 1)  # the survivors' ids and scores, the C side's scratch, the maximum
    out_at = data_address(out)
    settings = _filter_settings(params)
    count = lib.filter(data_address(row), row.shape[0], settings[1], out_at)
    if count < 1:
        return None
    if not math.isfinite(settings[0].inv_t * max(1.0, abs(float(out[4 * k])))):
        raise SamplingError(f"temperature {params.temperature:g} is too small to divide logits by")
    return Dist(out[:count].view(np.int64), out[k : k + count], out_width, at=(out_at, out_at + 8 * k))


def proposal_acceptance(p: Dist, token: int, q: Dist | None) -> float:
    """How likely the exact rule accepts a proposal where the target's processed distribution is p:
    sum_x min(p(x), q(x)) for a proposal drawn from q (its expectation over the draw, a steadier
    estimate than one outcome), p(token) for a point mass (q None)."""
    if q is None:
        return p.prob(token)
    return p.overlap(q)


@dataclass(frozen=True)
class Sampler:
    """How one generation draws tokens: the settings, the keyed noise, and the verification rule
    (`same_as_plain`: drafts are accepted only where they equal the target's own draw).
    `drafts_in_graph`: a drafter whose model can filters its rows in its llama.cpp graph (backend
    sampling: engine.drafts_in_graph)."""

    params: SamplingParams
    noise: Noise
    same_as_plain: bool = False
    drafts_in_graph: bool = False

    @property
    def mode(self) -> str:
        if self.params.greedy:
            return "greedy"
        return "same-as-plain" if self.same_as_plain else "rejection"

    def draft_draw(self, q: Dist, position: int, attempt: int) -> int:
        """The draft's token at `position` from its distribution q. Same-as-plain: with the target's
        own noise there, so the draft lands where the target will whenever q allows it. Rejection
        sampling: fresh noise for each attempt (a position may be drafted again after a rejection
        before it), so the draw never correlates with a later decision at that position."""
        if self.same_as_plain:
            return q.draw(self.noise, position)
        return q.draw(self.noise, position, DRAFT, salt=attempt)
