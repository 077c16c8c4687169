"""The schemes with per-pair references (tests/positional/naive.py) through the model and the entry points with
no other edit: training with memory and episode resets, evaluation past the training memory, compare."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc_lab.model import MemoryTransformer, ModelConfig
from tests.positional.naive import CONTENT_FREE, DATA_DEPENDENT
from tests.schemes import COPE, FIRE, FOX, PATH


def test_every_content_free_scheme_trains_with_memory_and_episode_resets():
    """Two layers, memory, an episode reset (memory dropped, offset back to 0) in the middle: finite loss,
    a gradient for every parameter of the scheme."""
    for name in CONTENT_FREE:
        options = {FIRE: {"init_threshold": 8.0}, COPE: {"max_position": 16}}.get(name, {})
        cfg = ModelConfig(vocab_size=23, n_layer=2, d_model=16, n_head=2, d_inner=32, mem_len=8, posenc=name)
        cfg.posenc_kwargs = options
        model = MemoryTransformer(cfg).train()
        x = torch.randint(23, (3, 2, 8))
        mems, loss = None, 0.0
        for seg in range(3):
            offset = 8 * seg if seg < 2 else 0
            out = model(x[seg], x[seg].roll(-1, 1), mems=mems if seg < 2 else None, offset=offset)
            mems, loss = out.mems, loss + out.loss
        loss.backward()
        assert torch.isfinite(loss), name
        for pname, p in model.scheme.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.any(), (name, pname)


@pytest.mark.parametrize("name", CONTENT_FREE)
def test_each_content_free_scheme_trains_and_evaluates_past_its_training_memory(name, tmp_path):
    """The entry points with no other edit: Hydra's posenc=<name> trains (lengths sized by the scheme), and the
    checkpoint evaluates at three times the training memory (CoPE's counts clamped at max_position, FIRE's
    queries past their threshold)."""
    from posenc_lab.evaluate import evaluate_checkpoint
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    results = train(compose_config("train", tiny(tmp_path / "run", tmp_path / "cache", f"posenc={name}", steps=2)))
    longer = evaluate_checkpoint(results["checkpoint"], mem_len=48, max_batches=2)
    assert math.isfinite(longer["loss"]) and longer["mem_len"] == 48


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, dict]:
    """posenc=<name> with no other edit: each data-dependent scheme trained 2 tiny steps with memory on the recall
    stream (episode resets included); name -> results.json. Exact resume: tests/test_lit.py."""
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    work = tmp_path_factory.mktemp("datadep-runs")
    return {
        name: train(compose_config("train", tiny(work / name, work / "cache", f"posenc={name}", steps=2)))
        for name in DATA_DEPENDENT
    }


@pytest.mark.parametrize("name", DATA_DEPENDENT)
def test_each_data_dependent_scheme_evaluates_past_its_training_memory(trained, name):
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
