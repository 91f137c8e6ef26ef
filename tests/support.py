"""Helpers shared by the test modules (imported as `support`: pytest puts tests/ on sys.path).

- statistics: total variation, a simulated null threshold, empirical distributions;
- the exact output distribution of one speculative position under the right rule and under the
  plausible wrong ones (what an exactness test must be able to tell apart);
- the plain greedy reference (the target alone, one token per llama_decode);
- where the real trained pair lives (tests use the `shared_models` fixture, which skips without it),
  and a tiny GGUF writer. (Isolation from the user's environment: an autouse fixture in conftest.)
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from specli.costs import CostModel

# ---------------------------------------------------------------------------------------------------
# model paths
# ---------------------------------------------------------------------------------------------------

# ../shared/models beside the repository: only on the development machine (and its CI), never in a
# user's clone, so tests that use it skip without it (use the `shared_models` fixture).
SHARED_MODELS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "models"
STORIES_TARGET = SHARED_MODELS_DIR / "stories260K.gguf"
STORIES_DRAFT = SHARED_MODELS_DIR / "llama2xs-279K-draft.gguf"

PROMPT = "Once upon a time"  # both vocabularies (fixture and TinyStories) tokenize it into words


# ---------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------


def tv(a: np.ndarray, b: np.ndarray) -> float:
    """Total variation distance between two distributions over the same ids."""
    return 0.5 * float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum())


def null_tv_threshold(p: np.ndarray, n: int, *, quantile: float = 0.999, sims: int = 2000) -> float:
    """The `quantile` of TV(empirical, p) over `sims` simulated samples of n draws from p itself:
    an exact sampler exceeds it with probability 1 - quantile. Seeded, so a test's verdict is fixed."""
    p = np.asarray(p, np.float64)
    p = p / p.sum()
    freq = np.random.default_rng(5).multinomial(n, p, size=sims) / n
    return float(np.quantile(0.5 * np.abs(freq - p).sum(axis=1), quantile))


def empirical(tokens: Iterable[int], width: int) -> tuple[np.ndarray, int]:
    """(frequency of each id, number of draws) for a sequence of drawn ids."""
    counts = np.bincount(np.fromiter(tokens, dtype=np.int64), minlength=width).astype(np.float64)
    n = int(counts.sum())
    return (counts / n if n else counts), n


def coarse_ids(*laws: np.ndarray, min_mass: float = 0.005) -> np.ndarray:
    """The ids that carry at least min_mass in one of the laws: an exactness test compares those one
    by one and lumps the rest (hundreds of ids of tiny mass would only add noise to TV, and a
    function of an exact sampler's output is still exact)."""
    return np.flatnonzero(np.max(np.stack([np.asarray(law, np.float64) for law in laws]), axis=0) >= min_mass)


def coarsen(dist: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """dist over `ids`, then one entry for all the other ids together."""
    dist = np.asarray(dist, np.float64)
    kept = dist[ids]
    return np.append(kept, max(0.0, float(dist.sum() - kept.sum())))


# ---------------------------------------------------------------------------------------------------
# the exact rule and the plausible wrong ones, in closed form
# ---------------------------------------------------------------------------------------------------

EXACT = "exact"
# After a rejection, sample from p itself instead of norm(max(p - q, 0)): the classic bug.
RESAMPLE_P = "resample from p"
# After a rejection, sample from the draft's q.
RESAMPLE_Q = "resample from q"
# After a rejection, draw from max(p - q, 0) as if it summed to 1 (inverse CDF with an unscaled
# uniform): the missing mass lands on the last id with residual mass.
UNNORMALISED = "unnormalised residual"
# All drafts accepted: the bonus token drawn from the last draft position's row p_k, not p_(k+1).
BONUS_ROW = "bonus from the wrong row"
# --draft-p-min gated on the sampled token's probability q(x) instead of the draft's top probability.
PMIN_SAMPLED = "p_min on the sampled token"

# Rules that change what a drafted position emits (BONUS_ROW changes only the bonus token,
# PMIN_SAMPLED only a drafter with p_min).
POSITION_RULES = (RESAMPLE_P, RESAMPLE_Q, UNNORMALISED)


@dataclass(frozen=True)
class PositionLaw:
    """How one position's token comes about: accepted[y] = P(the proposal y is accepted),
    other[y] = P(the target emits y otherwise: the replacement after a rejection, or a plain sample
    where nothing was proposed). After `accepted` the round goes on; after `other` a new one starts."""

    accepted: np.ndarray
    other: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.accepted + self.other

    @property
    def acceptance(self) -> float:
        return float(self.accepted.sum())


def unnormalised_draw(r: np.ndarray) -> np.ndarray:
    """What an inverse-CDF draw that takes the residual r for a distribution emits: r itself, and the
    missing mass 1 - sum(r) on the last id with mass (where specli's sampler clamps an overshoot)."""
    out = np.asarray(r, np.float64).copy()
    nonzero = np.flatnonzero(out > 0)
    if nonzero.size:
        out[nonzero[-1]] += max(0.0, 1.0 - float(out.sum()))
    return out


def position_law(
    p: np.ndarray,
    q: np.ndarray | None = None,
    *,
    token: int | None = None,
    rule: str = EXACT,
    p_min: float = 0.0,
) -> PositionLaw:
    """The exact law of a drafted position under `rule`: a proposal drawn from q (a draft model), or
    the point mass at `token` (n-gram lookup, q None). p_min: the draft model's --draft-p-min."""
    p = np.asarray(p, np.float64)
    if q is None:
        if token is None:
            raise ValueError("a point-mass proposal needs its token")
        q = np.zeros_like(p)
        q[token] = 1.0
        point = True
    else:
        q = np.asarray(q, np.float64)
        point = False
    accept = np.minimum(p, q)  # q(x) * min(1, p(x) / q(x))
    gated = np.zeros_like(p)  # mass of proposals never made (the drafter stopped first)
    if p_min and not point:
        if rule == PMIN_SAMPLED:
            gated = np.where(q < p_min, q, 0.0)
        elif q.max() < p_min:
            gated = q.copy()
        accept = np.where(gated > 0, 0.0, accept)
    rejected = float((q - gated).sum() - accept.sum())  # proposals made and rejected
    residual = p - accept if point else np.maximum(p - q, 0.0)  # p with the point removed, or p - min(p, q)
    if rule == RESAMPLE_P:
        replacement = p
    elif rule == RESAMPLE_Q:
        replacement = q
    elif rule == UNNORMALISED:
        replacement = unnormalised_draw(residual)
    else:
        total = residual.sum()
        replacement = residual / total if total > 0 else p
    other = rejected * replacement + float(gated.sum()) * p
    return PositionLaw(accept, other)


def bonus_law(p_next: np.ndarray, p_last_draft: np.ndarray, rule: str = EXACT) -> np.ndarray:
    """The bonus token's law after all k drafts passed: p_(k+1), or p_k under BONUS_ROW."""
    return np.asarray(p_last_draft if rule == BONUS_ROW else p_next, np.float64)


def next_position_law(
    first: PositionLaw, t1: int, after_accept: np.ndarray, after_other: np.ndarray
) -> np.ndarray:
    """The law of the next position given that the first emitted t1: after_accept if t1 was an
    accepted proposal (the round goes on), after_other if the target emitted it (a new round)."""
    a, o = float(first.accepted[t1]), float(first.other[t1])
    return (a * np.asarray(after_accept, np.float64) + o * np.asarray(after_other, np.float64)) / (a + o)


def assert_power(
    law_by_rule: dict[str, np.ndarray], p: np.ndarray, n: int, what: str, margin: float = 3.0
) -> float:
    """Every wrong rule's law is at least `margin` null thresholds (n draws) away from p: the test
    can tell each of them from the exact rule. Returns the threshold."""
    threshold = null_tv_threshold(p, n)
    for rule, law in law_by_rule.items():
        distance = tv(law, p)
        assert distance >= margin * threshold, (
            f"{what}: no power against '{rule}': TV {distance:.4f} < {margin} x null threshold "
            f"{threshold:.4f} (n = {n})"
        )
    return threshold


# ---------------------------------------------------------------------------------------------------
# the plain greedy reference
# ---------------------------------------------------------------------------------------------------


def plain_greedy(
    model_path: str | Path, prompt: str | Sequence[int], n: int, *, stop_at_eog: bool = True, n_ctx: int = 512
) -> list[int]:
    """The target's own greedy decoding, one token per llama_decode, no engine involved: the
    reference speculative greedy output must equal token for token."""
    from specli.llama import Model, ModelOptions

    with Model(model_path, ModelOptions(n_ctx=n_ctx, n_threads=1)) as m:
        tokens = m.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        rows = m.decode(tokens, outputs="last")
        out: list[int] = []
        for _ in range(n):
            t = int(np.argmax(rows[0]))
            if stop_at_eog and m.is_eog(t):
                break
            out.append(t)
            rows = m.decode([t], outputs="last")
        return out


# ---------------------------------------------------------------------------------------------------
# GGUF writing
# ---------------------------------------------------------------------------------------------------

OMIT = object()  # pass as a keyword to leave that metadata key out
# An SPM vocabulary needs a token for each of the 256 bytes (llama.cpp spells unknown text as bytes).
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
DEFAULT_TOKENS = ["<unk>", "<s>", "</s>", *BYTE_TOKENS] + [f"t{i}" for i in range(29)]
N_VOCAB = len(DEFAULT_TOKENS)  # 288


def interrupt_on_line(n: int, *, in_function: str | None = None, counts=lambda frame: True):  # noqa: ANN001, ANN202
    """A trace function that raises KeyboardInterrupt (Ctrl-C) on the n-th line specli executes (a
    line count, not a time), counting only lines of `in_function` (any, if None) where `counts`."""
    left = [n]

    def trace(frame, event, arg):  # noqa: ANN001, ANN202
        code = frame.f_code
        if "/specli/" not in code.co_filename or (in_function is not None and code.co_name != in_function):
            return None
        if event == "line" and left[0] > 0 and counts(frame):
            left[0] -= 1
            if left[0] == 0:
                raise KeyboardInterrupt
        return trace

    return trace


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    n_layer: Any = 2,
    n_embd: Any = 16,
    n_head: Any = 4,
    n_head_kv: Any = 2,
    ctx: Any = 128,
    tokens: Any = None,
    tokenizer: Any = "llama",
    bos: Any = 1,
    eos: Any = 2,
    layers: int | None = None,
    embd_shape: tuple[int, int] | None = None,
    tensors: bool = True,
    extra: dict[str, Any] | None = None,
    alignment: int | None = None,
) -> Path:
    """A tiny GGUF: token_embd, output_norm and one blk.N.attn_norm per layer, all F32."""
    if tokens is None:
        tokens = DEFAULT_TOKENS
    w = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_name("tiny test model")
    for value, add in (
        (n_layer, w.add_block_count), (n_embd, w.add_embedding_length), (n_head, w.add_head_count),
        (n_head_kv, w.add_head_count_kv), (ctx, w.add_context_length), (tokenizer, w.add_tokenizer_model),
        (tokens, w.add_token_list), (bos, w.add_bos_token_id), (eos, w.add_eos_token_id),
    ):
        if value is not OMIT:
            add(value)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in (extra or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    if tensors:
        n_vocab = len(tokens) if tokens is not OMIT else N_VOCAB
        emb_rows, emb_cols = embd_shape or (n_vocab, n_embd if isinstance(n_embd, int) else 16)
        w.add_tensor("token_embd.weight", np.zeros((emb_rows, emb_cols), dtype=np.float32))
        w.add_tensor("output_norm.weight", np.ones(emb_cols, dtype=np.float32))
        n_blocks = layers if layers is not None else (n_layer if isinstance(n_layer, int) else 2)
        for i in range(n_blocks):
            w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(emb_cols, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def free_drafting(*sources: str) -> CostModel:
    """Costs in which drafting is free, for tests that need -k auto to draft from its first round: a
    verify batch costs what one token does, a draft step next to nothing (the first sample of each
    size is taken for a cold decode, so one is spent on each)."""
    costs = CostModel()
    for _ in range(3):
        for m in range(1, 14):
            costs.observe_verify(m, 1.0 + 1e-4 * (m - 1))
        for source in sources or ("draft", "ngram", "mtp"):
            costs.observe_draft(source, 1, 1e-9)
    return costs


# ---------------------------------------------------------------------------------------------------
# the installed `specli` in a subprocess
# ---------------------------------------------------------------------------------------------------

EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
TIMEOUT = 120  # a hang fails the test (TimeoutExpired) instead of blocking the run


def _env(cwd: Path) -> dict[str, str]:
    """No models.toml from the user's config dir."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg"), "XDG_STATE_HOME": str(cwd / "state")}
    env.pop("SPECLI_CONFIG", None)
    return env


def specli(
    *args: str | bytes, cwd: Path, input: str | bytes | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess:
    binary = isinstance(input, bytes) or any(isinstance(a, bytes) for a in args)
    proc = subprocess.run(
        [EXE, *args],
        capture_output=True,
        cwd=cwd,
        input=input if binary or input is None else input.encode(),
        timeout=timeout,
        env=_env(cwd),
    )
    # decoded here, leniently: what the program wrote for invalid input must not break the test itself
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def specli_on_terminal(*args: str, cwd: Path, timeout: float = TIMEOUT,
                       env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run with stdout on a pseudo-terminal (the coloured live view), stderr on a pipe."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([EXE, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                            cwd=cwd, env={**_env(cwd), "COLUMNS": "200", "TERM": "xterm", **(env or {})})
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError("no output on the terminal: hung?")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = proc.stderr.read().decode("utf-8", "replace")
    rc = proc.wait(timeout=timeout)
    return rc, b"".join(chunks).decode("utf-8", "replace"), err


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specli: error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def write_config(directory: Path, text: str, name: str = "models.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path
