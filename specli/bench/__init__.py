"""`specli bench`: does speculation pay for this pair on this machine? Measured, paired, explained.

The models are loaded once. For every (temperature, k) and every prompt, a plain target run and a
speculative run on the same prompt and seed are made back to back, `repeat` times, so machine drift
(thermal throttling, other load) hits both halves of a pair alike; the figure that matters is the
ratio within each pair. Both runs start from an empty cache and time only generation (prompt
evaluation is reported apart), so every run measures the same thing.

Once per bench, the target's verify cost T_v(m) is measured for batch sizes m = 1 .. max k + 1: on a
CPU a batch of 5 costs about twice one token, on a GPU almost the same. With the measured acceptance
and draft cost it gives Leviathan et al.'s predicted speedup; measured / predicted (the efficiency)
shows how much goes to overheads the formula does not model (sampling, bookkeeping).

The modules, in the order data flows through them:
  suite       what to run: the configuration, the built-in prompts, a --prompts file, option lists
  measure     loading (through specli.api.load), warm-up, the verify-cost curve, the paired runs
  prediction  the verify-cost curve and the speedup it predicts (Leviathan et al.)
  results     the records: one per run, one per configuration, the whole bench
  aggregate   runs -> per-configuration figures (medians, pooled acceptance, forks), caveats
  files       the JSON and CSV outputs, written atomically

They compute and return dataclasses; specli.ui.bench_view renders them.
"""
