"""The attention section's shares (analysis/attention_span.py): the mass a learned sink takes and the mass on the
oldest key each query sees, planted through the sink's logits of a trained checkpoint: a sink far above every
logit takes nearly all, one far below takes none, and then every row's mass is on keys again."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.train import train
from posenc_lab_analysis.attention_span import AttentionSettings, attention_mass
from posenc_lab_analysis.runs import load_run
from tests.helpers_train import compose_config, tiny
from tests.schemes import ROPE


@pytest.fixture(scope="module")
def sink_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention")
    train(compose_config("train", tiny(root / "run", root / "cache", f"posenc={ROPE}", "model.attention_sink=true",
                                       steps=3, data="pystdlib")))  # fmt: skip
    return load_run(root / "run")


def shares(run, logit: float):
    with torch.no_grad():
        for block in run.model().blocks:
            block.sink.logit.fill_(logit)
    _, heads = attention_mass(run, AttentionSettings(n_rows=2, n_segments=1), "test")
    return heads


def test_a_sink_far_above_takes_the_mass_and_far_below_none(sink_run):
    high, low = shares(sink_run, 30.0), shares(sink_run, -30.0)
    assert (high["sink_share"] > 0.999).all() and (high["first_key_share"] < 1e-6).all()
    assert (high["memory_share"] < 1e-6).all()
    assert (low["sink_share"].abs() < 1e-6).all()
    assert ((low["first_key_share"] > 0) & (low["first_key_share"] < low["memory_share"])).all()
    assert (low["memory_share"] <= 1 + 1e-9).all()
