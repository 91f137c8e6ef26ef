"""specli_synth: the synthetic GGUF models load in llama.cpp, tokenize like SentencePiece, decode
deterministically, are not degenerate, and the draft agrees with the target only partly."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
from support import PROMPT, plain_greedy

from specli.llama import Model, ModelOptions  # noqa: E402
from specli_synth import demo, fixtures  # noqa: E402
from specli_synth.demo import DemoConfig, build_demo_pair  # noqa: E402
from specli_synth.fixtures import (  # noqa: E402
    FIXTURE_CHAT_TEMPLATE,
    FIXTURE_N_VOCAB,
    FIXTURE_TARGET,
    build_fixture_pair,
    fixture_vocab,
)
from specli_synth.gguf_writer import LlamaSpec, write_llama_gguf  # noqa: E402
from specli_synth.ngram_model import SynthModelConfig, write_ngram_model  # noqa: E402
from specli_synth.ngram_stats import ngram_factors  # noqa: E402
from specli_synth.vocab import TOKEN_TYPE_BYTE, Vocab, train_vocab  # noqa: E402


def load(path: Path, n_ctx: int = 512) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=256, n_threads=1, logits_all=True, verbose=False
    )


def logits_along(llm: llama_cpp.Llama, tokens: list[int]) -> np.ndarray:
    """Logits after each token of *tokens* (row i predicts token i + 1)."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float64)


def gguf_tokens(path: Path) -> list[str]:
    return [str(t) for t in gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].contents()]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the fixture models ----------------------------------------------------------------------------------


def test_fixture_models_load_and_tokenize_into_pieces(fixture_models) -> None:
    target, draft = load(fixture_models.target), load(fixture_models.draft)
    assert target.n_vocab() == draft.n_vocab() == FIXTURE_N_VOCAB
    tokens = target.tokenize(PROMPT.encode())
    assert tokens[0] == fixture_models.vocab.bos_id  # add_bos
    pieces = [target.detokenize([t]).decode() for t in tokens[1:]]
    assert pieces == [" Once", " upon", " a", " time"]  # SPM pieces with the leading-space marker
    assert draft.tokenize(PROMPT.encode()) == tokens
    assert target.token_bos() == 1 and target.token_eos() == 2


@pytest.mark.parametrize("text", ["naïve café ☃ 🙂", "tabs\tand\nnew lines", "<s> literal </s>", "x" * 40])
def test_any_text_round_trips_through_byte_fallback(fixture_models, text: str) -> None:
    llm = load(fixture_models.target)
    tokens = llm.tokenize(text.encode(), add_bos=False)
    assert llm.detokenize(tokens).decode() == " " + text  # SPM adds one leading space


def test_target_and_draft_share_the_vocabulary_and_other_vocab_does_not(fixture_models) -> None:
    target_tokens = gguf_tokens(fixture_models.target)
    assert gguf_tokens(fixture_models.draft) == target_tokens
    assert gguf_tokens(fixture_models.target_with_template) == target_tokens
    other_tokens = gguf_tokens(fixture_models.other_vocab)
    assert len(other_tokens) == len(target_tokens)  # same size, so only a content check catches it
    assert other_tokens != target_tokens
    other = load(fixture_models.other_vocab)
    assert other.n_vocab() == FIXTURE_N_VOCAB
    assert other.tokenize(PROMPT.encode()) != load(fixture_models.target).tokenize(PROMPT.encode())


def test_gguf_metadata_is_what_llama_cpp_needs(fixture_models) -> None:
    reader = gguf.GGUFReader(fixture_models.target)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "llama"
    assert fields["tokenizer.ggml.model"] == "llama"
    assert fields["tokenizer.ggml.add_bos_token"] is True
    assert fields["tokenizer.ggml.add_eos_token"] is False
    assert (fields["tokenizer.ggml.unknown_token_id"], fields["tokenizer.ggml.bos_token_id"]) == (0, 1)
    assert fields["tokenizer.ggml.eos_token_id"] == 2
    for key in (
        "context_length",
        "embedding_length",
        "block_count",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.layer_norm_rms_epsilon",
        "rope.dimension_count",
        "rope.freq_base",
    ):
        assert f"llama.{key}" in fields
    assert "tokenizer.chat_template" not in fields
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    byte_ids = [i for i, t in enumerate(types) if t == TOKEN_TYPE_BYTE]
    assert [tokens[i] for i in byte_ids] == [f"<0x{b:02X}>" for b in range(256)]
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}  # GGUF order: {in, out}
    assert shapes["token_embd.weight"] == [FIXTURE_TARGET.n_embd, FIXTURE_N_VOCAB]
    assert shapes["blk.0.ffn_down.weight"] == [FIXTURE_TARGET.n_ff, FIXTURE_TARGET.n_embd]

    templated = gguf.GGUFReader(fixture_models.target_with_template).fields["tokenizer.chat_template"]
    assert templated.contents() == FIXTURE_CHAT_TEMPLATE
    assert (
        load(fixture_models.target_with_template).metadata["tokenizer.chat_template"] == FIXTURE_CHAT_TEMPLATE
    )


def test_decoding_is_deterministic_and_not_degenerate(fixture_models) -> None:
    prompt = load(fixture_models.target).tokenize(PROMPT.encode())
    first = plain_greedy(fixture_models.target, prompt, 80, stop_at_eog=False)
    assert plain_greedy(fixture_models.target, prompt, 80, stop_at_eog=False) == first
    assert len(set(first)) >= 10  # not one token (or a two-token loop) forever
    logits = logits_along(load(fixture_models.target), prompt + first)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    entropy = -(probs * np.log(probs + 1e-30)).sum(axis=1)
    assert 0.3 < entropy.mean() < 0.6 * np.log(FIXTURE_N_VOCAB)  # peaked, but not one-hot
    assert (probs.max(axis=1) < 0.999).mean() > 0.5


def test_draft_agrees_with_the_target_only_partly(fixture_models) -> None:
    target, draft = load(fixture_models.target), load(fixture_models.draft)
    prompts = [PROMPT, "The dog", "Pip and the bird"]
    agreement = []
    for text in prompts:
        prompt = target.tokenize(text.encode())
        path = prompt + plain_greedy(fixture_models.target, prompt, 100, stop_at_eog=False)
        positions = slice(len(prompt) - 1, len(path) - 1)
        target_choice = logits_along(target, path)[positions].argmax(axis=1)
        draft_choice = logits_along(draft, path)[positions].argmax(axis=1)
        agreement.append((target_choice == draft_choice).mean())
    assert 0.35 < np.mean(agreement) < 0.85, agreement  # measured ~0.57


def test_context_matters(fixture_models) -> None:
    """The previous-token head: the same last token after different contexts gives different logits."""
    llm = load(fixture_models.target)
    a = logits_along(llm, llm.tokenize(b"The dog came"))[-1]
    b = logits_along(llm, llm.tokenize(b"Pip and the bird came"))[-1]
    assert np.abs(a - b).max() > 0.5


def test_fixture_build_is_deterministic_and_seeded(tmp_path: Path) -> None:
    first = build_fixture_pair(tmp_path / "a")
    again = build_fixture_pair(tmp_path / "b")
    other_seed = build_fixture_pair(tmp_path / "c", seed=1)
    assert [sha256(p) for p in first] == [sha256(p) for p in again]
    assert sha256(first[0]) != sha256(other_seed[0])
    assert gguf_tokens(first[0]) == gguf_tokens(other_seed[0])
    assert not list(tmp_path.rglob("*.partial"))


# -- the weights mean what they should -------------------------------------------------------------------


def test_noise_free_model_reproduces_its_factors_exactly(tmp_path: Path) -> None:
    """Embedding/output orientation, RMS-norm bookkeeping and the RoPE previous-token head as llama.cpp
    runs them: with no random blocks, llama.cpp's argmax equals the factors' bigram + skip-bigram one."""
    trained = fixture_vocab()
    config = replace(FIXTURE_TARGET, noise_gain=0.0, seen_dims=0, seen_penalty=0.0)
    path = write_ngram_model(tmp_path / "exact.gguf", trained, config, dtype="f32")
    factors = ngram_factors(
        list(trained.documents),
        FIXTURE_N_VOCAB,
        trained.vocab.bos_id,
        rank=config.rank,
        skip_rank=config.skip_rank,
        skip_weight=config.skip_weight,
        sharpness=config.sharpness,
        seed=config.seed,
    )
    tokens = np.concatenate([[trained.vocab.bos_id], trained.documents[0], trained.documents[1]])[:120]
    previous = np.concatenate([tokens[:1], tokens[:-1]])  # BOS attends to itself
    ideal = factors.next_row[tokens] @ factors.next_col.T + factors.skip_row[previous] @ factors.skip_col.T
    ideal += factors.bias
    got = logits_along(load(path), [int(t) for t in tokens])
    assert (got.argmax(axis=1) == ideal.argmax(axis=1)).mean() > 0.97
    centered = [x - x.mean(axis=1, keepdims=True) for x in (got, ideal)]
    assert np.corrcoef(centered[0].ravel(), centered[1].ravel())[0, 1] > 0.99


def test_seen_head_penalizes_repetition(tmp_path: Path) -> None:
    trained = fixture_vocab()
    base = replace(FIXTURE_TARGET, noise_gain=0.0)
    plain = load(write_ngram_model(tmp_path / "plain.gguf", trained, replace(base, seen_penalty=0.0)))
    penalized = load(write_ngram_model(tmp_path / "penalized.gguf", trained, base))
    tokens = plain.tokenize(" ".join(["bird"] * 20).encode())
    bird = tokens[-1]
    assert tokens[1:] == [bird] * 20
    drop = logits_along(plain, tokens)[-1] - logits_along(penalized, tokens)[-1]
    drop -= np.median(drop)  # other tokens: +-crosstalk of the random codes, centred on 0
    assert drop[bird] > 0.6 * base.seen_penalty  # "bird" is 20/21 of the context
    assert drop[bird] == drop.max()


COPY_MODEL = SynthModelConfig(
    n_embd=128,
    n_layer=5,
    n_head=2,
    n_head_kv=2,
    n_ff=64,
    rank=24,
    skip_rank=4,
    seen_dims=24,
    seen_penalty=10.0,
    sharpness=1.2,
    noise_gain=0.01,
    induction=4.0,
    induction_dims=12,
    rope_theta=1e6,
    seed=5,
    name="copy-model",
)


def test_induction_head_copies_a_passage_that_recurs(tmp_path: Path) -> None:
    """A passage of random tokens, then its first words again: the copying model continues the passage
    (as real LMs do, and as prompt lookup predicts); without induction it does not."""
    trained = fixture_vocab()
    copier = write_ngram_model(tmp_path / "copier.gguf", trained, COPY_MODEL)
    plain = write_ngram_model(tmp_path / "plain.gguf", trained, replace(COPY_MODEL, induction=0.0))
    rng = np.random.default_rng(3)
    passage = [int(t) for t in rng.choice(np.arange(260, FIXTURE_N_VOCAB), size=40, replace=False)]
    prompt = [trained.vocab.bos_id, *passage, *passage[:4]]
    assert np.mean(np.array(plain_greedy(copier, prompt, 30, stop_at_eog=False)) == passage[4:34]) > 0.9
    assert np.mean(np.array(plain_greedy(plain, prompt, 30, stop_at_eog=False)) == passage[4:34]) < 0.3


def test_induction_head_does_not_fire_on_text_it_has_not_seen(tmp_path: Path) -> None:
    """No earlier occurrence of the last two tokens: the BOS sink takes the attention and the logits
    are the n-gram model's (up to the single-token head, off here, and small crosstalk)."""
    trained = fixture_vocab()
    copier = load(write_ngram_model(tmp_path / "copier.gguf", trained, COPY_MODEL))
    plain = load(write_ngram_model(tmp_path / "plain.gguf", trained, replace(COPY_MODEL, induction=0.0)))
    rng = np.random.default_rng(4)
    tokens = [trained.vocab.bos_id, *(int(t) for t in rng.choice(np.arange(260, FIXTURE_N_VOCAB), 30, False))]
    a, b = logits_along(copier, tokens)[2:], logits_along(plain, tokens)[2:]
    similarity = np.array([np.corrcoef(x, y)[0, 1] for x, y in zip(a, b, strict=True)])
    assert np.median(similarity) > 0.85
    assert np.mean(similarity < 0.5) < 0.1  # misfires: random match codes that beat the sink


# -- write_llama_gguf ------------------------------------------------------------------------------------


def tiny_spec(n_vocab: int) -> LlamaSpec:
    return LlamaSpec(n_vocab=n_vocab, n_embd=32, n_layer=1, n_head=2, n_head_kv=1, n_ff=64, name="tiny")


def random_weights(spec: LlamaSpec, *, tied: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    weights = {
        name: np.ones(shape, np.float32) if len(shape) == 1 else rng.normal(0, 0.3, shape).astype(np.float32)
        for name, shape in spec.tensor_shapes().items()
    }
    if tied:
        del weights["output.weight"]
    return weights


@pytest.mark.parametrize(("dtype", "tolerance"), [("f32", 1e-4), ("f16", 0.05), ("q8_0", 0.3)])
def test_weight_dtypes_load_and_agree(tmp_path: Path, dtype: str, tolerance: float) -> None:
    vocab = fixture_vocab().vocab
    spec = tiny_spec(len(vocab))
    weights = random_weights(spec)
    # Through specli's loader: llama-cpp-python's Llama repacks Q8_0 weights for AMX, whose kernels
    # crash on a batch on some Xeons (specli.llama.repacks).
    def logits(dtype: str) -> np.ndarray:
        path = write_llama_gguf(tmp_path / f"{dtype}.gguf", spec, vocab, weights, dtype=dtype)
        with Model(path, ModelOptions(n_ctx=512, n_threads=1)) as model:
            return model.decode(model.tokenize(PROMPT, add_special=True), outputs="all").astype(np.float64)

    got, expected = logits(dtype), logits("f32")
    np.testing.assert_allclose(got, expected, atol=tolerance)  # logits span about +-5
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).mean() >= 0.8


def test_tied_output_and_chat_template(tmp_path: Path) -> None:
    vocab = fixture_vocab().vocab
    spec = tiny_spec(len(vocab))
    path = write_llama_gguf(
        tmp_path / "tied.gguf",
        spec,
        vocab,
        random_weights(spec, tied=True),
        chat_template="{{ messages[0]['content'] }}",
    )
    llm = load(path)
    assert llm.metadata["tokenizer.chat_template"] == "{{ messages[0]['content'] }}"
    assert np.isfinite(logits_along(llm, llm.tokenize(PROMPT.encode()))).all()


def test_write_llama_gguf_refuses_bad_input_and_leaves_no_file(tmp_path: Path) -> None:
    vocab = fixture_vocab().vocab
    spec = tiny_spec(len(vocab))
    weights = random_weights(spec)
    with pytest.raises(ValueError, match="n_vocab"):
        write_llama_gguf(tmp_path / "m.gguf", tiny_spec(len(vocab) + 1), vocab, weights)
    with pytest.raises(ValueError, match="missing"):
        write_llama_gguf(
            tmp_path / "m.gguf", spec, vocab, {k: v for k, v in weights.items() if "ffn_up" not in k}
        )
    bad_shape = dict(weights, **{"blk.0.attn_k.weight": lambda: np.zeros((32, 32), np.float32)})
    with pytest.raises(ValueError, match="attn_k"):
        write_llama_gguf(tmp_path / "m.gguf", spec, vocab, bad_shape)
    assert list(tmp_path.iterdir()) == []  # nothing half-written
    with pytest.raises(ValueError):
        LlamaSpec(n_vocab=10, n_embd=30, n_layer=1, n_head=4, n_head_kv=1, n_ff=8)
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(("<unk>", "<s>", "<s>"), (0.0,) * 3, (2, 3, 3))


# -- vocabulary learning ---------------------------------------------------------------------------------


def test_train_vocab_layout() -> None:
    trained = fixture_vocab()
    vocab = trained.vocab
    assert len(vocab) == FIXTURE_N_VOCAB
    assert vocab.tokens[:3] == ("<unk>", "<s>", "</s>")
    assert vocab.tokens[3:259] == tuple(f"<0x{b:02X}>" for b in range(256))
    assert vocab.token_id("\u2581the") > 258 and vocab.token_id("\u2581") > 258
    merged = vocab.scores[259:]
    assert list(merged) == sorted(merged, reverse=True)  # merge order = score order
    assert len(trained.documents) == len(fixtures.fixture_documents())
    with pytest.raises(ValueError, match="merges"):
        train_vocab(["ab ab ab"], 400)


# -- the demo pair's code path, at toy size --------------------------------------------------------------


def test_demo_pair_builds_at_toy_size(tmp_path: Path) -> None:
    toy = DemoConfig(
        n_vocab=1024,
        corpus_chars=150_000,
        n_ctx_train=512,
        target=SynthModelConfig(
            n_embd=128,
            n_layer=2,
            n_head=2,
            n_head_kv=1,
            n_ff=256,
            rank=64,
            skip_rank=16,
            seen_dims=8,
            seen_penalty=8.0,
            name="toy-target",
        ),
        draft=SynthModelConfig(
            n_embd=64,
            n_layer=2,
            n_head=2,
            n_head_kv=1,
            n_ff=128,
            rank=32,
            skip_rank=8,
            seen_dims=4,
            seen_penalty=6.0,
            name="toy-draft",
        ),
    )
    reports: list[tuple[str, float]] = []
    target_path, draft_path = build_demo_pair(
        tmp_path, config=toy, progress=lambda s, f: reports.append((s, f))
    )
    assert (target_path.name, draft_path.name) == (demo.DEMO_TARGET_FILE, demo.DEMO_DRAFT_FILE)
    fractions = [f for _, f in reports]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert gguf_tokens(target_path) == gguf_tokens(draft_path)
    target, draft = load(target_path), load(draft_path)
    prompt = target.tokenize(b"Return the value")
    assert prompt == draft.tokenize(b"Return the value") and len(prompt) <= 5
    continuation = plain_greedy(target_path, prompt, 40, stop_at_eog=False)
    assert len(set(continuation)) >= 8
    assert target.detokenize(continuation).decode(errors="replace").strip()
