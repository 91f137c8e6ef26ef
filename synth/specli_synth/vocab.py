"""SentencePiece-style vocabularies (``tokenizer.ggml.model = "llama"``) and learning one with BPE.

:class:`Vocab` is what a GGUF file stores (token texts, scores, types, special ids); :func:`train_vocab`
learns one from text, with LLaMA's layout (specials, the 256 byte-fallback tokens, merged pieces in
merge order, single characters), and returns the documents as token ids for counting statistics.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Token types as llama.cpp reads them from ``tokenizer.ggml.token_type`` (same values as gguf.TokenType).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_BYTE = 6

SPACE_MARK = "\u2581"  # "▁": SentencePiece's visible space; llama.cpp maps " " to it before tokenizing


@dataclass(frozen=True)
class Vocab:
    """A SentencePiece-style vocabulary as stored in GGUF (``tokenizer.ggml.*``)."""

    tokens: tuple[str | bytes, ...]
    scores: tuple[float, ...]
    token_types: tuple[int, ...]
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.scores) != n or len(self.token_types) != n:
            raise ValueError("tokens, scores and token_types must have the same length")
        if len(set(self.tokens)) != n:
            raise ValueError("duplicate token text in vocabulary")
        for special in (self.unk_id, self.bos_id, self.eos_id):
            if not 0 <= special < n:
                raise ValueError(f"special token id {special} outside vocabulary of {n}")

    def __len__(self) -> int:
        return len(self.tokens)

    def token_id(self, text: str) -> int:
        """Id of the token whose text is exactly *text* (KeyError if absent)."""
        return self.tokens.index(text)


BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")

# Pre-tokenization of space-escaped text into the chunks merges may not cross: a word with its leading
# "▁", a single digit, a run of punctuation, a run of spaces (leaving the last one for the next word),
# or one other whitespace character (these become byte tokens, like "\n" in LLaMA's vocabulary).
_CHUNK_RE = re.compile(
    rf"{SPACE_MARK}?[^\W\d_]+"
    rf"|{SPACE_MARK}?\d"
    rf"|{SPACE_MARK}?(?:[^\w\s{SPACE_MARK}]|_)+"
    rf"|{SPACE_MARK}+(?={SPACE_MARK}[^\s{SPACE_MARK}])"
    rf"|{SPACE_MARK}+"
    r"|\s"
)


def piece_vocab(n: int) -> Vocab:
    """A vocabulary of *n* tokens without a corpus: the specials, the 256 byte tokens, then synthetic
    pieces "▁p0", "▁p1", ... (a large vocabulary's size, for speed, not for text)."""
    pieces = [f"{SPACE_MARK}p{i}" for i in range(n - len(SPECIAL_TOKENS) - len(BYTE_TOKENS))]
    tokens = (*SPECIAL_TOKENS, *BYTE_TOKENS, *pieces)
    types = (TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL,
             *([TOKEN_TYPE_BYTE] * len(BYTE_TOKENS)), *([TOKEN_TYPE_NORMAL] * len(pieces)))
    scores = tuple(0.0 if i < len(SPECIAL_TOKENS) + len(BYTE_TOKENS) else -float(i) for i in range(n))
    return Vocab(tokens, scores, types)


def _chunks(document: str) -> list[str]:
    """Split a document as llama.cpp sees it (leading space added, spaces escaped) into merge chunks."""
    return _CHUNK_RE.findall(SPACE_MARK + document.replace(" ", SPACE_MARK))


@dataclass(frozen=True)
class TrainedVocab:
    """A learned vocabulary plus its training documents as token ids (for counting statistics)."""

    vocab: Vocab
    documents: tuple[np.ndarray, ...]


def train_vocab(documents: Sequence[str], n_vocab: int, *, min_char_count: int = 2) -> TrainedVocab:
    """Learn an SPM-style vocabulary of exactly *n_vocab* tokens from *documents* with BPE merges.

    Layout (like LLaMA's): ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens ``<0x00>``..``<0xFF>``,
    the merged pieces in merge order (score ``-rank``, so llama.cpp's highest-score-first SPM merging
    replays them), then the single characters seen at least *min_char_count* times (whitespace other
    than the space is left to byte fallback). Characters outside the vocabulary become byte tokens.
    Raises ValueError when the text has too few distinct pairs to reach *n_vocab*.
    """
    chunk_counts: Counter[str] = Counter()
    char_counts: Counter[str] = Counter()
    doc_chunks = [_chunks(doc) for doc in documents]
    for chunks in doc_chunks:
        chunk_counts.update(chunks)
    for chunk, count in chunk_counts.items():
        for char in chunk:
            char_counts[char] += count
    base_chars = sorted(
        c for c, n in char_counts.items() if n >= min_char_count and (c == SPACE_MARK or not c.isspace())
    )
    n_merges = n_vocab - len(SPECIAL_TOKENS) - len(BYTE_TOKENS) - len(base_chars)
    if n_merges < 0:
        raise ValueError(f"n_vocab {n_vocab} too small for {len(base_chars)} base characters")

    # Symbols are ints: first the byte tokens, then base characters, then merged pieces.
    symbol_text: list[str] = list(BYTE_TOKENS) + base_chars
    char_symbol = {c: 256 + i for i, c in enumerate(base_chars)}
    words = list(chunk_counts)
    word_counts = [chunk_counts[w] for w in words]
    word_symbols: list[list[int]] = []
    for word in words:
        symbols: list[int] = []
        for char in word:
            if char in char_symbol:
                symbols.append(char_symbol[char])
            else:
                symbols.extend(char.encode("utf-8"))  # byte-fallback symbols 0..255 never merge
        word_symbols.append(symbols)

    merged_pieces = _learn_merges(word_symbols, word_counts, symbol_text, n_merges)
    if len(merged_pieces) < n_merges:
        raise ValueError(f"corpus only supports {len(merged_pieces)} merges, {n_merges} needed for {n_vocab}")

    tokens = list(SPECIAL_TOKENS) + list(BYTE_TOKENS) + merged_pieces + base_chars
    scores = [0.0] * (len(SPECIAL_TOKENS) + 256) + [
        -float(i) for i in range(len(merged_pieces) + len(base_chars))
    ]
    types = (
        [TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL]
        + [TOKEN_TYPE_BYTE] * 256
        + [TOKEN_TYPE_NORMAL] * (len(merged_pieces) + len(base_chars))
    )
    vocab = Vocab(tuple(tokens), tuple(scores), tuple(types))

    token_of_text = {text: i for i, text in enumerate(tokens)}
    symbol_token = np.array([token_of_text[text] for text in symbol_text], dtype=np.int32)
    word_tokens = {word: symbol_token[symbols] for word, symbols in zip(words, word_symbols, strict=True)}
    encoded = tuple(
        np.concatenate([word_tokens[c] for c in chunks]) if chunks else np.zeros(0, np.int32)
        for chunks in doc_chunks
    )
    return TrainedVocab(vocab, encoded)


def _learn_merges(
    word_symbols: list[list[int]], word_counts: list[int], symbol_text: list[str], n_merges: int
) -> list[str]:
    """BPE on the words in place (word_symbols is rewritten); returns the merged pieces in merge order.

    Pair counts are updated incrementally and the best pair found with a lazily invalidated heap, so
    each merge costs time proportional to the words it touches. Ties break on the symbol ids, which
    makes the result deterministic.
    """
    pair_counts: dict[tuple[int, int], int] = {}
    pair_words: dict[tuple[int, int], set[int]] = {}

    def mergeable(a: int, b: int) -> bool:
        return a >= 256 and b >= 256

    for w, symbols in enumerate(word_symbols):
        count = word_counts[w]
        for pair in zip(symbols, symbols[1:], strict=False):
            if mergeable(*pair):
                pair_counts[pair] = pair_counts.get(pair, 0) + count
                pair_words.setdefault(pair, set()).add(w)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    pieces: list[str] = []
    symbol_of_text = {text: i for i, text in enumerate(symbol_text)}
    while len(pieces) < n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale heap entry
        a, b = pair
        text = symbol_text[a] + symbol_text[b]
        new = symbol_of_text.get(text, -1)
        if new < 0:  # ("ab", "c") and ("a", "bc") both make "abc": one token, two merge paths
            new = len(symbol_text)
            symbol_text.append(text)
            symbol_of_text[text] = new
            pieces.append(text)
        changed: set[tuple[int, int]] = set()
        for w in sorted(pair_words.pop(pair, ())):
            old = word_symbols[w]
            merged: list[int] = []
            i = 0
            while i < len(old):
                if i + 1 < len(old) and old[i] == a and old[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(old[i])
                    i += 1
            count = word_counts[w]
            old_pairs = [p for p in zip(old, old[1:], strict=False) if mergeable(*p)]
            new_pairs = [p for p in zip(merged, merged[1:], strict=False) if mergeable(*p)]
            for p in old_pairs:
                pair_counts[p] -= count
                changed.add(p)
            for p in new_pairs:
                pair_counts[p] = pair_counts.get(p, 0) + count
                changed.add(p)
            for p in set(old_pairs) - set(new_pairs):
                if p != pair:
                    pair_words[p].discard(w)
            for p in new_pairs:
                pair_words.setdefault(p, set()).add(w)
            word_symbols[w] = merged
        pair_counts.pop(pair, None)
        for p in sorted(changed):
            count = pair_counts.get(p, 0)
            if count > 0:
                heapq.heappush(heap, (-count, p))
            else:
                pair_counts.pop(p, None)
                pair_words.pop(p, None)
    return pieces


