"""The data-dependent schemes (fox, stickbreaking, path) against naive per-pair references written from
docs/SCHEMES.md, forward and backward (q, k, v, the layer input and every parameter), with and without memory
and the same-length mask; their options, and training and evaluation through the entry points."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.positional import SCHEMES, scheme_options
from tests.positional.naive_fox_stickbreaking_path import (
    _seed,  # noqa: F401 - an autouse fixture
    assert_equals_naive,
    new_inputs,
)
from tests.positional.test_schemes import MASKS, make_positions, make_scheme, qkv
from tests.schemes import FOX, PATH, STICKBREAKING

NEW = (FOX, STICKBREAKING, PATH)


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("name", NEW)
def test_each_equals_its_naive_reference_forward_and_backward(name, L, M, same_length):
    """With and without memory (M = 0, M < L, M = L, M > L) and the same-length mask; the unfused path (fox: SDPA
    with its [B, H, L, N] bias)."""
    scheme = make_scheme(name).train()
    scheme.attention_impl = "unfused"
    q, k, v, x = new_inputs(L, M)
    assert_equals_naive(name, scheme, q, k, v, make_positions(L, M, same_length), x)


def test_documented_options_exist():
    assert scheme_options(FOX) == {}
    assert scheme_options(STICKBREAKING) == {"attend_current": False}
    assert scheme_options(PATH) == {"w_rank": 32, "short_conv": True}


def test_each_reads_no_position_and_refuses_random_positions():
    for name in NEW:
        assert SCHEMES[name].random_positions_refused and "no position" in SCHEMES[name].random_positions_refused
        assert "between" in SCHEMES[name].not_translation_invariant


@pytest.mark.parametrize(
    "name, options, match",
    [
        (PATH, {"w_rank": 0}, r"path: posenc.w_rank must be an integer >= 1 or null .*got 0"),
        (PATH, {"short_conv": "yes"}, r"path: posenc.short_conv must be true or false, got 'yes'"),
        (STICKBREAKING, {"attend_current": 1}, r"stickbreaking: posenc.attend_current must be true or false, got 1"),
    ],
)
def test_bad_options_raise_naming_the_value(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_scheme(name, **options)


def test_without_the_layer_input_they_say_what_they_need():
    q, k, v = qkv(5, 3)
    for name in (FOX, PATH):
        with pytest.raises(ValueError, match=rf"{name}: .*layer's input.*context"):
            make_scheme(name).attend(0, q, k, v, make_positions(5, 3), 0.0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, dict]:
    """posenc=<name> with no other edit: each trained 2 tiny steps with memory on the recall stream (episode
    resets included); name -> results.json. Exact resume: tests/test_lit.py."""
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    work = tmp_path_factory.mktemp("datadep-runs")
    return {
        name: train(compose_config("train", tiny(work / name, work / "cache", f"posenc={name}", steps=2)))
        for name in NEW
    }


@pytest.mark.parametrize("name", NEW)
def test_each_evaluates_past_its_training_memory(trained, name):
    """Evaluation loads every parameter of the scheme (its gates and maps) and serves three times the memory."""
    from posenc_lab.evaluate import evaluate_checkpoint, load_model

    longer = evaluate_checkpoint(trained[name]["checkpoint"], mem_len=48, max_batches=2)
    assert math.isfinite(longer["loss"]) and longer["mem_len"] == 48 and longer["scheme"] == name
    saved = torch.load(trained[name]["checkpoint"], weights_only=True)["state_dict"]
    loaded = load_model(trained[name]["checkpoint"]).scheme.state_dict()
    assert loaded and all(torch.equal(saved[f"model.scheme.{key}"], value) for key, value in loaded.items())


def test_compare_reads_their_runs(trained, tmp_path, capsys):
    """posenc-lab compare, fox against path on the recall stream (a word corpus): each side's figure is the
    perplexity of its own dump's mean loss, the difference theirs in nats per word."""
    import re
    from pathlib import Path

    import numpy as np

    from posenc_lab_analysis import compare

    runs = [str(Path(trained[n]["checkpoint"]).parents[1]) for n in (FOX, PATH)]
    assert compare.main([*runs, "--n-streams", "4", "--n-tokens", "32", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    means = []
    for side, run in zip("AB", runs):
        (dump,) = tmp_path.glob(f"{side}_*.npz")
        with np.load(dump) as d:
            means.append(float(d["loss"][0][d["scored"]].mean()))
        ppl = re.search(rf"^{side}: {re.escape(run)} \(1 seed\(s\)\): val ppl (\d+\.\d+) ", out, re.M)
        assert ppl and float(ppl.group(1)) == pytest.approx(math.exp(means[-1]), rel=1e-3), out
    shown = re.search(r"^A - B: ([-+]\d+\.\d+) .* nats per word", out, re.M)
    assert shown and float(shown.group(1)) == pytest.approx(means[0] - means[1], abs=1e-4), out
    assert "one seed" in out
