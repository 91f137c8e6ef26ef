"""Synthetic GGUF models, written from numpy weights: the test suite's fixtures and `specli demo-models`.

The runtime (engine, drafters, front ends) never imports it: only the tests and `specli demo-models` /
`specli demo` do. From general to specific:

* :mod:`~specli_synth.gguf_writer`: :func:`write_llama_gguf` writes any ``llama``-architecture GGUF file
  from a :class:`LlamaSpec`, a vocabulary and a mapping of tensor name to array (or to a callable making
  it, so that big models are written one tensor at a time).
* :mod:`~specli_synth.vocab`: :class:`Vocab` (a SentencePiece-style vocabulary with the 256 byte-fallback
  tokens) and :func:`train_vocab`, which learns one with BPE merges.
* :mod:`~specli_synth.ngram_stats`: token bigram and skip-bigram statistics factored by a truncated SVD.
* :mod:`~specli_synth.ngram_model` and :mod:`~specli_synth.heads`: a llama model whose logits are those
  statistics (embedding and output matrices carry the factors; hand-built attention heads supply the
  previous token, the context's repetition penalty and copying from the context).
* :mod:`~specli_synth.fixtures`: the tiny test models (built in well under a second);
  :mod:`~specli_synth.hybrid`: tiny LFM2 and Qwen3.5 (recurrent + attention) models;
  :mod:`~specli_synth.demo`: the demo pair, learned from the standard library's docstrings (~30 s).

Everything is deterministic for a given seed (and, for the demo pair, a given Python standard library,
which is its corpus).
"""
