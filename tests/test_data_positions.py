"""The model's embedding of the data's position ids (``model.data_positions``, posenc_lab/data_positions.py): added to
the input as its formula says, read through the memory across segments as in one pass, refused with a clear line
where the data gives no ids or ids past the table (before any compute where the config shows it), named as a cell
of its own, and trained and judged through the entry points."""

from __future__ import annotations

import re

import pytest
import torch

from posenc_lab.ablate.plan import scheme_entry
from posenc_lab.cellnames import scheme_label
from posenc_lab.context import stream_losses
from posenc_lab.data_positions import DataPositionsError
from posenc_lab.errors import ConfigError
from posenc_lab.model import ModelConfig
from tests.helpers_train import compose_config, tiny
from tests.models import make_model

V = 13  # addition's vocabulary: 10 digits, +, =, .


def test_the_ids_embedding_is_added_to_the_input():
    """h^0 = sqrt(D) (E[x] + A[id]): with A's rows for these ids set to zero the model is the plain model with its
    weights, and a different id of one token changes the outputs from that token on, never before it."""
    torch.manual_seed(0)
    given = make_model("nope", n_layer=2, vocab_size=V, randomize="all", data_positions="abacus")
    plain = make_model("nope", n_layer=2, vocab_size=V, randomize="all")
    plain.load_state_dict({k: v for k, v in given.state_dict().items() if not k.startswith("data_positions.")})
    tokens = torch.randint(0, V, (2, 12))
    ids = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        given.data_positions.table[ids.unique()] = 0.0
        assert torch.allclose(given(tokens, position_ids={"abacus": ids}).logits, plain(tokens).logits, atol=1e-6)
        given.data_positions.table.normal_()
        base = given(tokens, position_ids={"abacus": ids}).logits
        moved = ids.clone()
        moved[:, 5] += 1
        other = given(tokens, position_ids={"abacus": moved}).logits
    assert torch.equal(base[:, :5], other[:, :5]) and not torch.allclose(base[:, 5:], other[:, 5:])
    seen = []
    given.drop.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        given(tokens, position_ids={"abacus": ids})
    scale = 16**0.5  # sqrt(D): A is scaled as E is
    assert torch.allclose(seen[0], scale * (given.embedding.weight[tokens] + given.data_positions.table[ids]))


def test_with_memory_an_instance_across_segments_reads_as_in_one_pass():
    model = make_model("nope", n_layer=2, vocab_size=V, randomize="all", data_positions="coupling")
    tokens = torch.randint(0, V, (3, 33))
    ids = {"coupling": torch.randint(0, 50, (3, 33))}
    whole = stream_losses(model, tokens, segment_len=32, mem_len=0, position_ids=ids)
    pieces = stream_losses(model, tokens, segment_len=8, mem_len=32, position_ids=ids)
    assert torch.allclose(whole.loss, pieces.loss, atol=1e-5)
    without = stream_losses(model, tokens, segment_len=8, mem_len=32, position_ids={"coupling": ids["coupling"] * 0})
    assert not torch.allclose(whole.loss, without.loss)  # the ids reached every segment


def test_a_batch_without_the_ids_or_with_ids_past_the_table_is_refused():
    model = make_model("nope", vocab_size=V, data_positions="abacus", data_positions_size=16)
    tokens = torch.randint(0, V, (1, 8))
    with pytest.raises(
        DataPositionsError, match="model.data_positions=abacus reads the data's abacus position ids, and "
    ):
        model(tokens, position_ids={"coupling": torch.zeros(1, 8, dtype=torch.long)})
    with pytest.raises(
        DataPositionsError, match=re.escape("position id 16 is past the table of model.data_positions_size=16")
    ):
        model(tokens, position_ids={"abacus": torch.full((1, 8), 16)})


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(data_positions="digits"), "model.data_positions must be null or one of abacus, coupling, got 'digits'"),
        (dict(data_positions="abacus", data_positions_size=1), "model.data_positions_size must be an integer >= 2"),
    ],
)
def test_bad_options_name_what_is_valid(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(posenc="nope", **options)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["data.corpus.position_ids=true", "model.data_positions=coupling"], "data.name=reverse gives abacus: set"),
        (["model.data_positions=abacus"], "data.name=reverse gives none: set data.corpus.position_ids=true"),
        (
            ["data.corpus.position_ids=true", "data.corpus.position_shift=40", "model.data_positions=abacus"],
            "model.data_positions_size=32 is too small for the abacus ids of data.name=reverse, up to 44",
        ),
    ],
)
def test_what_the_data_cannot_give_is_refused_before_any_compute(extra, message, tmp_path):
    from posenc_lab.train import train

    corpus = ["data.corpus.train_tokens=3000", "data.corpus.eval_instances=8", "data.corpus.n_train=4"]
    extra = [*corpus, *extra, "model.data_positions_size=32"]
    overrides = tiny(tmp_path / "run", tmp_path / "cache", *extra, data="reverse")
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(compose_config("train", overrides))
    assert not (tmp_path / "run").exists()  # nothing written, nothing trained


def test_a_cell_with_the_data_positions_is_a_cell_of_its_own():
    assert scheme_entry("nope+abacus") == ("nope", ["model.data_positions=abacus"])
    assert scheme_entry("fire+coupling") == ("fire", ["model.data_positions=coupling"])
    assert scheme_label("nope", model={"data_positions": "abacus"}) == "nope+abacus"
    assert scheme_label("nope", model={"data_positions": None}) == "nope"


def test_it_trains_and_the_report_reads_it_with_the_ids(tmp_path):
    from posenc_lab.train import train
    from posenc_lab_analysis.lengthgen import evaluate
    from posenc_lab_analysis.runs import load_run

    corpus = ["data.corpus.train_tokens=3000", "data.corpus.eval_instances=8", "data.corpus.n_train=3"]
    ids = ["data.corpus.position_ids=true", "data.corpus.position_shift=8", "model.data_positions=abacus"]
    overrides = tiny(tmp_path / "run", tmp_path / "cache", *corpus, *ids, "posenc=nope", data="addition_reversed")
    results = train(compose_config("train", overrides))
    assert results["data"] == "addition_reversed" and 0 <= results["test"]["acc"] <= 1
    run = load_run(tmp_path / "run")
    scored = evaluate(run, "test")
    assert sorted(scored) == [3, 6, 12, 24] and all(s.correct is not None for s in scored.values())
    run.model().data_positions.kind = "missing"  # the report's reading used the ids: without them the model refuses,
    with pytest.raises(DataPositionsError, match="reads the data's missing position ids"):  # never as a length
        evaluate(run, "test")


def test_a_run_saved_before_these_options_existed_resumes(tmp_path):
    """A run's record from before an option was added lacks its key; it ran with the option's default, so it is the
    same run and continues; a value other than that default is another run."""
    import json

    from posenc_lab.errors import RunDirError
    from posenc_lab.train import train

    corpus = ["data.corpus.train_tokens=3000", "data.corpus.eval_instances=8", "data.corpus.n_train=3"]
    run = tmp_path / "run"
    train(compose_config("train", tiny(run, tmp_path / "cache", *corpus, steps=2, data="copy")))
    record = json.loads((run / "run.json").read_text())
    for key in ("data_positions", "data_positions_size"):
        del record["identity"]["model"][key]
    for key in ("position_ids", "position_shift"):
        del record["identity"]["data"]["corpus"][key]
    (run / "run.json").write_text(json.dumps(record))
    results = train(compose_config("train", tiny(run, tmp_path / "cache", *corpus, steps=4, data="copy")))
    assert results["steps"] == 4  # continued from step 2 under the older record
    other = tiny(run, tmp_path / "cache", *corpus, "model.data_positions_size=64", steps=6, data="copy")
    with pytest.raises(RunDirError, match="model.data_positions_size: run None, now 64"):
        train(compose_config("train", other))
