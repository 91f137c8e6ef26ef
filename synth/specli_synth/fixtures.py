"""Tiny models for the test suite: a target, a partly-agreeing draft with the same vocabulary, a model
with a different vocabulary and a target with a chat template, all built in well under a second from a
small original story (:data:`FIXTURE_TEXT`). Deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from specli_synth.gguf_writer import WeightDType
from specli_synth.ngram_model import SynthModelConfig, write_ngram_model
from specli_synth.vocab import TrainedVocab, Vocab, train_vocab

# A small original story: the training text of the fixture vocabulary and bigram statistics.
FIXTURE_TEXT = """\
Once upon a time, there was a little fox named Pip. Pip lived in a small house at the edge of a big
green wood. Every morning Pip went out to look for berries. He liked the red berries best, but the blue
ones were good too.

One day Pip saw a bird sitting on a branch. The bird was sad because she had lost her song. "Why are
you sad?" asked Pip. "I can not find my song," said the bird. "It flew away in the wind."

Pip wanted to help the bird. He said, "Let us look for your song together." The bird was happy and
they went into the wood. They looked under the old tree. They looked behind the big rock. They looked
in the tall grass by the river.

At the river they met a turtle. The turtle was very old and very slow, but he was also very wise.
"Have you seen a song?" asked the bird. The turtle thought for a long time. Then he said, "I heard a
song near the hill."

So Pip and the bird walked to the hill. The sun was warm and the sky was blue. On the way they sang
and played. When they came to the hill, they heard a sweet sound. It was the song of the bird! It was
hiding in a flower.

The bird opened her mouth and the song came back to her. She sang and sang, and her song was the most
beautiful song in the wood. Pip was very happy. He said, "You have your song again!" The bird said,
"Thank you, Pip. You are a good friend." From that day on, the bird sang for Pip every morning. And
Pip always shared his berries with the bird.

Once upon a time, there was a little girl named Mia. Mia had a red ball and a big dog. Every day Mia
and the dog played in the park. They ran and jumped and laughed in the sun.

One day the ball rolled into the pond. The dog jumped into the water to get it. Mia laughed and
clapped her hands. The dog came back with the ball. He was wet and happy. Mia gave him a big hug and
they went home.

At home, mom made a warm soup. Mia ate the soup and told mom about the ball and the pond. Mom smiled
and said, "You have a good dog." Mia said, "He is the best dog in the world." That night Mia went to
bed early. She dreamed of the park, the pond, the ball and the sun.

The next morning it was raining. Mia could not go to the park, so she played with her toys in the
house. She built a tall tower with her blocks. The dog looked at the tower and wagged his tail. Then
the tower fell down. Mia was not sad. She laughed and built the tower again, and this time it was even
taller than before. When the rain stopped, Mia and the dog went out to play. The grass was wet and the
air smelled fresh and sweet.

Once upon a time, there was a small boat on a big sea. The boat was brave and liked to sail far away.
One day a storm came. The wind was strong and the waves were very high. The boat was scared, but it
did not stop. After the storm, the sea was calm again.

The boat saw an island with tall trees and a white beach. On the island lived a little crab. The crab
said, "Hello, boat! Do you want to be my friend?" The boat said yes, and every day after that the boat
and the crab talked about the sea, the wind and the stars. The end.
"""

FIXTURE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

FIXTURE_N_VOCAB = 600

FIXTURE_TARGET = SynthModelConfig(
    n_embd=64,
    n_layer=2,
    n_head=4,
    n_head_kv=2,
    n_ff=128,
    rank=28,
    skip_rank=10,
    seen_dims=6,
    seen_penalty=15.0,
    sharpness=1.2,
    noise_gain=0.05,
    seed=1,
    name="specli-fixture-target",
)
FIXTURE_DRAFT = SynthModelConfig(
    n_embd=48,
    n_layer=2,
    n_head=2,
    n_head_kv=1,
    n_ff=96,
    rank=30,
    skip_rank=4,
    seen_dims=4,
    seen_penalty=10.0,
    sharpness=1.2,
    noise_gain=0.1,
    data_fraction=0.8,
    seed=2,
    name="specli-fixture-draft",
)

# Same vocabulary size as the fixture target, but learned from the lowercased text: different tokens.
FIXTURE_OTHER_VOCAB = SynthModelConfig(
    n_embd=32,
    n_layer=1,
    n_head=2,
    n_head_kv=2,
    n_ff=64,
    rank=16,
    sharpness=1.5,
    seed=3,
    name="specli-fixture-other-vocab",
)


@dataclass(frozen=True)
class FixtureModels:
    """Paths of the tiny test models. target and draft share one vocabulary; other_vocab does not."""

    target: Path
    draft: Path
    other_vocab: Path  # same vocabulary size as target, different tokens
    target_with_template: Path  # target + tokenizer.chat_template (FIXTURE_CHAT_TEMPLATE)
    vocab: Vocab = field(repr=False)


def fixture_documents(lowercase: bool = False) -> list[str]:
    """The fixture training documents: the paragraphs of FIXTURE_TEXT, each unwrapped onto one line."""
    text = FIXTURE_TEXT.lower() if lowercase else FIXTURE_TEXT
    return [" ".join(paragraph.split("\n")) for paragraph in text.strip().split("\n\n")]


@lru_cache(maxsize=2)
def fixture_vocab(lowercase: bool = False) -> TrainedVocab:
    """The fixture vocabulary (FIXTURE_N_VOCAB tokens) learned from :func:`fixture_documents`.

    Cached: treat the result (and its documents' arrays) as read-only.
    """
    return train_vocab(fixture_documents(lowercase), FIXTURE_N_VOCAB)


def build_fixture_pair(
    directory: str | Path, *, seed: int = 0, chat_template: str | None = None, dtype: WeightDType = "f32"
) -> tuple[Path, Path]:
    """Write the tiny target and draft (one shared vocabulary) into *directory*; returns their paths.

    *seed* varies the random parts (same vocabulary for every seed); *chat_template* goes into the
    target only.
    """
    directory = Path(directory)
    trained = fixture_vocab()
    target = write_ngram_model(
        directory / "fixture-target.gguf",
        trained,
        reseed(FIXTURE_TARGET, seed),
        dtype=dtype,
        chat_template=chat_template,
    )
    draft = write_ngram_model(
        directory / "fixture-draft.gguf", trained, reseed(FIXTURE_DRAFT, seed), dtype=dtype
    )
    return target, draft


def build_fixture_models(directory: str | Path, *, seed: int = 0) -> FixtureModels:
    """Write every fixture model (target, draft, other-vocabulary model, target with chat template)."""
    directory = Path(directory)
    target, draft = build_fixture_pair(directory, seed=seed)
    templated = write_ngram_model(
        directory / "fixture-target-chat.gguf",
        fixture_vocab(),
        reseed(FIXTURE_TARGET, seed),
        dtype="f32",
        chat_template=FIXTURE_CHAT_TEMPLATE,
    )
    other = write_ngram_model(
        directory / "fixture-other-vocab.gguf",
        fixture_vocab(lowercase=True),
        reseed(FIXTURE_OTHER_VOCAB, seed),
        dtype="f32",
    )
    return FixtureModels(target, draft, other, templated, fixture_vocab().vocab)


def reseed(config: SynthModelConfig, seed: int) -> SynthModelConfig:
    """*config* for the fixture set of *seed* (0: as written above); the hybrid fixtures use it too."""
    return replace(config, seed=config.seed + 1000 * seed)
