"""DroPE (posenc_lab/positional/drope.py): before the step K the scheme as it was, from K on the same weights with no
positional signal (rope: NoPE); the state follows the step the weights stand at, so a run resumes exactly on either
side of K and a checkpoint is evaluated as it trained; the schemes it cannot apply to are refused with the reason."""

from __future__ import annotations

import pytest
import torch

from posenc_lab.lit import load_lit
from posenc_lab.positional import SCHEME_NAMES, Dims, build_scheme, scheme_class
from posenc_lab.positional.drope import refusal
from posenc_lab.train import train
from tests.helpers_train import compose_config, record, recorded, tiny
from tests.models import make_model
from tests.schemes import ALIBI, COPE, FOX, HYBRID, NOPE, PATH, POPE, ROPE, SHAW, STICKBREAKING, T5, XL, XPOS
from tests.test_lit import RESUME_AT, RESUME_COMMON, resume_is_exact

K = 3
V, B = 23, 2


def pair(name: str, softmax_scale: str | None = None, **options):
    """(the scheme dropping at K, the same model without DroPE), equal weights, memory on."""
    model = dict(n_layer=2, mem_len=4, softmax_scale=softmax_scale)
    dropping = make_model(name, **model, randomize="all", posenc_kwargs={**options, "drop_at_step": K})
    plain = make_model(name, **model, randomize=None, posenc_kwargs=options)
    plain.load_state_dict(dropping.state_dict())
    return dropping, plain


def logits(model, x, mems=None):
    return model(x, mems=mems, offset=8).logits


@pytest.mark.parametrize("softmax_scale", [None, "ssmax"])  # SSMax is the model's: it stays, nope with ssmax from K
@pytest.mark.parametrize("name, options", [(ROPE, {}), (XPOS, {}), (T5, {"n_buckets": 8, "max_distance": 20}),
                                           (ALIBI, {}), (FOX, {}), (POPE, {}),
                                           (HYBRID, {"layers": [ROPE, ALIBI]})])  # fmt: skip
def test_before_k_the_scheme_from_k_on_nope_with_the_same_weights(name, options, softmax_scale):
    dropping, plain = pair(name, softmax_scale, **options)
    nope = make_model(NOPE, n_layer=2, mem_len=4, randomize=None, softmax_scale=softmax_scale)
    nope.load_state_dict(dropping.state_dict(), strict=False)  # the scheme's own parameters (t5's table) aside
    x, mems = torch.randint(V, (B, 5)), plain(torch.randint(V, (B, 8))).mems
    for step in (0, K - 1):
        dropping.at_step(step)
        torch.testing.assert_close(logits(dropping, x, mems), logits(plain, x, mems))
    for step in (K, K + 10):
        dropping.at_step(step)
        torch.testing.assert_close(logits(dropping, x, mems), logits(nope, x, mems))
    assert (logits(plain, x, mems) - logits(nope, x, mems)).abs().max() > 1e-3  # so the two can be told apart
    dropping.at_step(K - 1)  # back before K: read from the step, never a flag set once
    torch.testing.assert_close(logits(dropping, x, mems), logits(plain, x, mems))


def test_a_dropped_hybrid_keeps_its_windows_and_nope_layers():
    """[rope, nope] with a window of 2 keys on the rope layer: dropped, layer 0 still sees 2 keys, layer 1 all."""
    kwargs = {"layers": [ROPE, NOPE], "windows": {ROPE: 2}, "drop_at_step": K}
    model = make_model(HYBRID, n_layer=2, randomize="all", posenc_kwargs=kwargs)
    x = torch.randint(V, (B, 5))
    before = model(x, return_attention=True).attention
    model.at_step(K)
    after = model(x, return_attention=True).attention
    for probs in (before, after):
        assert [(p[0, 0] > 0).sum(-1).tolist() for p in probs] == [[1, 2, 2, 2, 2], [1, 2, 3, 4, 5]]
    assert (before[0] - after[0]).abs().max() > 1e-4  # the rotation is gone


def test_schemes_without_an_encoding_to_remove_are_refused_with_the_reason():
    refused = {n for n in SCHEME_NAMES if refusal(scheme_class(n))}
    assert {NOPE, XL, SHAW, COPE, STICKBREAKING, PATH} <= refused and not {ROPE, XPOS, T5, ALIBI, FOX, HYBRID} & refused
    with pytest.raises(ValueError, match=r"^nope: posenc.drop_at_step cannot apply: it has no positional encoding"):
        build_scheme(NOPE, Dims(2, 16, 2), drop_at_step=5)
    with pytest.raises(ValueError, match=r"^xl: posenc.drop_at_step cannot apply: it writes its own attention"):
        build_scheme(XL, Dims(2, 16, 2), drop_at_step=5)
    with pytest.raises(ValueError, match=r"^hybrid: posenc.drop_at_step cannot apply to its xl layers: it writes"):
        build_scheme(HYBRID, Dims(2, 16, 2), layers=[ROPE, XL], drop_at_step=5)
    for bad in (0, True, "5", 2.5):
        with pytest.raises(ValueError, match=rf"^rope: posenc.drop_at_step must be an integer >= 1 .*got {bad!r}$"):
            build_scheme(ROPE, Dims(2, 16, 2), drop_at_step=bad)


@pytest.mark.parametrize("drop_at", [RESUME_AT + 1, RESUME_AT - 1], ids=["resume-at-K-1", "resume-after-K"])
def test_a_run_resumes_exactly_across_the_drop(tmp_path, cache, drop_at):
    """Steps 1..8 in one go against steps 1..4, a checkpoint, then 5..8: equal losses, with K = 5 (the resumed run
    starts at K - 1: its first step still rotates, the next ones do not) and K = 3 (it resumes dropped). The
    checkpoints evaluate as they trained: dropped from step K on."""
    state = resume_is_exact(tmp_path, cache, f"posenc={ROPE}", f"+posenc.drop_at_step={drop_at}")
    assert state["hyper_parameters"]["model"]["posenc_kwargs"]["drop_at_step"] == drop_at
    mid = load_lit(tmp_path / "full" / "checkpoints" / f"step{RESUME_AT:07d}.ckpt")
    last = load_lit(tmp_path / "full" / "checkpoints" / "last.ckpt")
    assert (mid.model.scheme.dropped, last.model.scheme.dropped) == (RESUME_AT >= drop_at, True)
    if drop_at > RESUME_AT:  # the drop is seen: the same run without it has the same losses up to K, others after
        rope = tiny(tmp_path / "rope", cache, *RESUME_COMMON, f"posenc={ROPE}", *record(tmp_path / "rec_rope"), steps=8)
        train(compose_config("train", rope))
        plain, dropped = recorded(tmp_path / "rec_rope"), recorded(tmp_path / "rec_full")
        assert [s["loss"] for s in plain[:drop_at]] == pytest.approx([s["loss"] for s in dropped[:drop_at]], abs=1e-6)
        assert all(abs(a["loss"] - b["loss"]) > 1e-6 for a, b in zip(plain[drop_at:], dropped[drop_at:]))


def test_a_finished_run_continues_with_a_drop_at_or_after_its_step(tmp_path):
    """Resume takes another DroPE step only where the steps already taken ran the same under both: a rope run saved
    at step 3 continues with a drop at 3 or later (the paper's recipe: pretrain, then drop and recalibrate), not 2."""
    from posenc_lab.checkpoints import CheckpointError
    from posenc_lab.lit import LitLM
    from posenc_lab.resume import check_resumable

    def lit(**posenc):
        return LitLM(model=dict(vocab_size=V, n_layer=1, d_model=16, n_head=2, d_inner=32, posenc=ROPE,
                                posenc_kwargs=posenc))  # fmt: skip

    saved, path = lit(), tmp_path / "rope.ckpt"
    state = {"hyper_parameters": dict(saved.hparams), "state_dict": saved.state_dict(), "global_step": 3}
    torch.save({**state, "posenc_lab": {}}, path)
    assert check_resumable(path, lit(drop_at_step=3), datamodule=None) == 3
    with pytest.raises(CheckpointError, match=r"trained with another model: posenc_kwargs: checkpoint \{\}, now"):
        check_resumable(path, lit(drop_at_step=2), datamodule=None)
