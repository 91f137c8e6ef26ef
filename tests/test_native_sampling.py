"""native_sampling.c (the host filters and keyed draw in C, compiled on first use) gives what numpy's path
gives: the same support, scores and token for every row and setting, and the same text from a real model.
Where it cannot be built, specli says so and samples with numpy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from specli import GenerationParams, load
from specli import sampling as sampling_module
from specli.native import native, reason
from specli.sampling import DEFAULT_SAMPLING, Noise, SamplingError, SamplingParams, distribution


@pytest.fixture
def needs_native() -> None:
    """Skip where the C file cannot be built here (asked at run time, not at import: the session's
    SPECLI_NATIVE_DIR is set by then, so nothing is built in the user's cache)."""
    if native() is None:
        pytest.skip(f"no C build here: {reason()}")


@pytest.fixture
def numpy_only(monkeypatch):
    """Run the numpy path in this process: what a machine without a C compiler runs."""

    def use_numpy():
        monkeypatch.setattr(sampling_module, "native", lambda: None)

    def use_native():
        monkeypatch.setattr(sampling_module, "native", native)

    return use_numpy, use_native


def _rows(rng: np.random.Generator, n: int):
    """Rows of the shapes the filters meet: peaked, flat, ties at every boundary, masked (-inf)."""
    for kind in ("peaked", "flat", "ties", "masked", "wide"):
        for _ in range(3):
            row = rng.standard_normal(n).astype(np.float32)
            if kind == "peaked":
                row *= 4
                row[rng.integers(n, size=5)] += 12
            elif kind == "flat":
                row *= 0.3
            elif kind == "ties":
                row = np.round(row * 2) / 2  # many equal logits, at the top-k boundary too
                row[rng.integers(n, size=60)] = row.max()
            elif kind == "masked":
                row[rng.permutation(n)[: n * 9 // 10]] = -np.inf  # top-k reaches into -inf
            else:
                row *= 40  # a stand-in's large logits
            yield kind, row.astype(np.float32)


SETTINGS = [
    SamplingParams(temperature=t, top_k=k, top_p=p, min_p=mp)
    for t, k, p, mp in [
        (0.8, 40, 0.95, 0.05), (0.8, 40, 1.0, 0.0), (0.8, 40, 0.5, 0.0), (0.8, 40, 1.0, 0.2),
        (1.0, 1, 0.95, 0.05), (0.7, 5, 0.9, 0.1), (0.8, 64, 0.99, 0.01), (0.8, 65, 0.95, 0.05),
        (1.3, 200, 0.9, 0.0), (0.8, 1000, 1.0, 0.05), (0.8, 1000, 1.0, 0.0),
    ]
]


def _counting(names: tuple[str, ...], calls: Counter):
    """The C library with the calls of `names` counted into `calls` (the rest as they are)."""
    lib = native()

    class Counting:
        def __getattr__(self, name):
            def counted(*args):
                calls[name] += 1
                return getattr(lib, name)(*args)

            return counted if name in names else getattr(lib, name)

    return Counting()


def _same(a, b) -> bool:
    return np.array_equal(a.ids, b.ids) and np.array_equal(a.scores, b.scores)


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("n", [700, 5_000, 151_936, 262_144])
def test_the_c_filters_give_numpys_support_scores_and_token(n, numpy_only) -> None:
    use_numpy, use_native = numpy_only
    rng = np.random.default_rng(n)
    checked = 0
    for kind, row in _rows(rng, n):
        top = int(np.argmax(row))
        for params in SETTINGS:
            for banned in ((), (top,), (3, int(np.argsort(row)[-2]))):
                p = replace(params, banned=banned)
                use_native()
                a = distribution(row, p)
                use_numpy()
                b = distribution(row, p)
                assert _same(a, b), (kind, p)
                noise = Noise(checked)
                for position in range(3):
                    use_native()
                    ta = a.draw(noise, position, 2, 1)
                    use_numpy()
                    tb = b.draw(noise, position, 2, 1)
                    # supports past Noise's plain-Python size may part in the last bit of numpy's log
                    if a.ids is None or a.ids.shape[0] <= sampling_module._FEW:
                        assert ta == tb, (kind, p)
                checked += 1
    assert checked == 5 * 3 * len(SETTINGS) * 3


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("n", [700, 262_144])
def test_a_plain_rounds_token_in_one_call_is_the_distributions_draw(n, monkeypatch) -> None:
    """plain_token (a round with nothing drafted: the filter and the keyed draw in one C call) gives
    the token distribution(row).draw gives, for every row, setting, banned set and position, and it
    took the one call for each of them."""
    calls = Counter()
    counting = _counting(("filter_draw",), calls)
    rng = np.random.default_rng(n + 2)
    checked = one_call = 0
    for kind, row in _rows(rng, n):
        top = int(np.argmax(row))
        for params in SETTINGS:
            for banned in ((), (top,)):
                p = replace(params, banned=banned)
                before = row.copy()
                for position in range(3):
                    noise = Noise(checked)
                    monkeypatch.setattr(sampling_module, "native", lambda: counting)
                    mine = sampling_module.plain_token(row[None], p, noise, position)
                    monkeypatch.setattr(sampling_module, "native", native)
                    assert mine == distribution(row, p).draw(noise, position), (kind, p, position)
                    checked += 1
                    one_call += p.top_k < n  # a top k of the whole row is no filter
                np.testing.assert_array_equal(row, before)  # the row is read, not masked
    assert checked == 5 * 3 * len(SETTINGS) * 2 * 3
    assert calls["filter_draw"] == one_call > 0


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("bad", [np.nan, np.inf, "no mass"])
def test_a_plain_round_refuses_what_the_distribution_refuses(bad) -> None:
    """What the one call cannot take (a NaN or infinite logit, no mass) is decided by the
    distribution's path, with its error."""
    row = np.random.default_rng(3).standard_normal(151_936).astype(np.float32)
    params = DEFAULT_SAMPLING
    if bad == "no mass":
        row[:] = -np.inf
    else:
        row[77_777] = bad
    with pytest.raises(SamplingError) as expected:
        distribution(row, params).draw(Noise(3), 0)
    with pytest.raises(SamplingError) as e:
        sampling_module.plain_token(row[None], params, Noise(3), 0)
    assert str(e.value) == str(expected.value)


WHOLE_ROW = [SamplingParams(temperature=t) for t in (0.5, 1.0, 1.7)]  # no filter: Dist over every id


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("n", [700, 5_000, 151_936, 262_144])
def test_the_whole_row_draw_in_c_gives_numpys_token(n, numpy_only) -> None:
    """No filter: the same scores and blocks' maxima as numpy's, and the same keyed token at every
    position, purpose and salt (the C draw evaluates the few ids whose bound reaches the best value
    found so far, numpy every id of every block whose bound reaches the top-scoring id's value)."""
    use_numpy, use_native = numpy_only
    rng = np.random.default_rng(n + 1)
    draws = 0
    for kind, row in _rows(rng, n):
        for params in WHOLE_ROW:
            use_native()
            a = distribution(row, params)
            use_numpy()
            b = distribution(row, params)
            assert np.array_equal(a.scores, b.scores), (kind, params)
            np.testing.assert_array_equal(a._block_max, sampling_module._block_max(b.scores))
            for position in range(12):
                noise = Noise(draws)
                use_native()
                ta = a.draw(noise, position, position % 4, position % 3)
                use_numpy()
                tb = b.draw(noise, position, position % 4, position % 3)
                assert ta == tb, (kind, params, position)
                draws += 1
    assert draws == 5 * 3 * len(WHOLE_ROW) * 12


@pytest.mark.usefixtures("needs_native")
def test_the_c_filters_took_the_rows_they_could(numpy_only, monkeypatch) -> None:
    """The comparisons above are not numpy against numpy: the C filter runs for a top-k row, the
    whole-row scores and draw for a row with no filter."""
    calls = Counter()
    counting = _counting(("filter", "dense_scores", "dense_draw"), calls)
    monkeypatch.setattr(sampling_module, "native", lambda: counting)
    row = np.random.default_rng(1).standard_normal(151_936).astype(np.float32)
    distribution(row, DEFAULT_SAMPLING)
    distribution(row, WHOLE_ROW[1]).draw(Noise(1), 0)
    assert calls == {"filter": 1, "dense_scores": 1, "dense_draw": 1}


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("sampling", [DEFAULT_SAMPLING, WHOLE_ROW[1]], ids=["filtered", "whole-row"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, "no mass"])
def test_a_nan_or_infinite_row_is_refused_on_both_paths(bad, sampling, numpy_only) -> None:
    use_numpy, use_native = numpy_only
    row = np.random.default_rng(2).standard_normal(151_936).astype(np.float32)
    if bad == "no mass":
        row[:] = -np.inf
    else:
        row[77_777] = bad
    messages = []
    for use in (use_native, use_numpy):
        use()
        with pytest.raises(SamplingError) as e:
            distribution(row, sampling).draw(Noise(3), 0)
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert ("no mass" if bad == "no mass" else "NaN or infinite") in messages[0]


@pytest.mark.usefixtures("needs_native")
def test_the_c_noise_is_the_plain_python_noise_for_any_support() -> None:
    """One id's noise does not depend on how many are drawn together (the C library's log in both)."""
    noise = Noise(11)
    ids = np.array([0, 3, 255, 256, 70_000, 262_143, *range(1000, 1100)])
    together = noise.gumbel(5, ids, 1, 2)
    np.testing.assert_array_equal(together, np.array(noise.gumbel_few(5, ids.tolist(), 1, 2)))


@pytest.mark.usefixtures("needs_native")
def test_a_seeded_generation_prints_the_same_text_with_either_path(fixture_models, numpy_only) -> None:
    use_numpy, use_native = numpy_only
    out = {}
    with load(fixture_models.target, None, n_ctx=512, n_threads=1) as spec:
        for name, use in (("native", use_native), ("numpy", use_numpy)):
            use()
            out[name] = [spec.generate("Once upon a time", GenerationParams(
                max_tokens=48, seed=seed, sampling=DEFAULT_SAMPLING, ignore_eos=True)).complete().tokens
                for seed in range(4)]
    assert out["native"] == out["numpy"]
    assert len({tuple(t) for t in out["native"]}) > 1  # the seeds sampled different texts


def _reason_in_a_fresh_process(env: dict[str, str]) -> str:
    code = ("import numpy as np; from specli.native import reason; "
            "from specli.sampling import distribution, DEFAULT_SAMPLING; "
            "d = distribution(np.arange(5000, dtype=np.float32) / 100, DEFAULT_SAMPLING); "
            "print(reason()); print(sorted(d.ids.tolist())[-1])")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_a_compiler_sampling_uses_numpy_and_says_why(tmp_path) -> None:
    out = _reason_in_a_fresh_process({"CC": str(tmp_path / "no-such-cc"),
                                      "SPECLI_NATIVE_DIR": str(tmp_path / "n")})
    first, last_id = out.splitlines()
    assert first.startswith("numpy (no C build:"), first
    assert last_id == "4999"


def test_the_switch_keeps_numpy(tmp_path) -> None:
    out = _reason_in_a_fresh_process({"SPECLI_NATIVE_SAMPLING": "0",
                                      "SPECLI_NATIVE_DIR": str(tmp_path / "n")})
    assert out.splitlines()[0] == "numpy (SPECLI_NATIVE_SAMPLING=0)"
    assert not (tmp_path / "n").exists()  # nothing was built


@pytest.mark.usefixtures("needs_native")
def test_the_library_is_built_once_and_reused(tmp_path) -> None:
    env = {"SPECLI_NATIVE_DIR": str(tmp_path / "n")}
    first = _reason_in_a_fresh_process(env).splitlines()[0]
    assert first.startswith("native (") and str(tmp_path / "n") in first
    built = list((tmp_path / "n").iterdir())
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    # a second process loads it, even with no compiler at hand
    again = _reason_in_a_fresh_process({**env, "CC": str(tmp_path / "no-such-cc")}).splitlines()[0]
    assert again == first
    assert built[0].stat().st_mtime_ns == stamp


def test_a_directory_others_can_write_is_refused(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = _reason_in_a_fresh_process({"SPECLI_NATIVE_DIR": str(shared)})
    assert out.splitlines()[0].startswith("numpy (no C build:") and "not this user's own" in out
    assert list(shared.iterdir()) == []


@pytest.mark.usefixtures("needs_native")
@pytest.mark.parametrize("min_p", [0.05, 0.1, 0.3])
def test_a_logit_exactly_at_min_ps_floor_survives_on_both_paths(min_p, numpy_only) -> None:
    """min-p keeps p >= min_p * p_max: a logit at the floor itself (rounded to a float32 once) stays."""
    use_numpy, use_native = numpy_only
    rng = np.random.default_rng(3)
    row = rng.standard_normal(151_936).astype(np.float32)
    row[[10, 20_000, 150_000]] = [14.0, 13.0, 12.5]
    at_floor = [7, 99_999, 151_935]
    row[at_floor] = sampling_module._min_p_floor(float(row.max()), min_p)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=1.0, min_p=min_p)
    use_native()
    a = distribution(row, params)
    use_numpy()
    b = distribution(row, params)
    assert _same(a, b)
    assert set(at_floor) <= set(a.ids.tolist())


@pytest.mark.usefixtures("needs_native")
def test_a_new_build_removes_the_builds_of_earlier_versions(tmp_path) -> None:
    (tmp_path / "n").mkdir(mode=0o700)
    old = tmp_path / "n" / "specli-sampling-0000000000000000.so"
    old.write_bytes(b"an earlier version's build")
    first = _reason_in_a_fresh_process({"SPECLI_NATIVE_DIR": str(tmp_path / "n")}).splitlines()[0]
    assert first.startswith("native (")
    assert not old.exists() and len(list((tmp_path / "n").iterdir())) == 1


@pytest.mark.usefixtures("needs_native")
def test_a_damaged_library_is_built_again(tmp_path) -> None:
    env = {"SPECLI_NATIVE_DIR": str(tmp_path / "n")}
    first = _reason_in_a_fresh_process(env).splitlines()[0]
    built = next((tmp_path / "n").iterdir())
    built.write_bytes(b"not a library")
    again = _reason_in_a_fresh_process(env).splitlines()[0]
    assert again == first
    assert built.read_bytes()[:4] == b"\x7fELF" or sys.platform == "darwin"
