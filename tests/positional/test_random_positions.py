"""model.random_positions (Ruoss et al. 2023): each segment's keys take an ordered random subset of [0, P).

Every scheme that reads positions is checked with such positions (gaps between keys) against the same naive
per-pair references as with consecutive ones, forward and backward, on both attention paths; the schemes that
cannot use them are refused with their reason, before any compute.
"""

from __future__ import annotations

import pytest
import torch

from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEME_NAMES, SCHEMES, AttentionInputs, Positions, sized_options
from tests.positional import naive, test_fused, test_pope
from tests.positional.test_fused import grads, reference  # noqa: F401 (a fixture)
from tests.positional.test_schemes import B, D, make_positions, make_scheme, pe, qkv
from tests.schemes import (
    ALIBI,
    COPE,
    FOX,
    GLOBAL_SINUSOID,
    HYBRID,
    HYBRID_OF_TWO,
    LEARNED,
    NOPE,
    PATH,
    POPE,
    ROPE,
    SHAW,
    SINUSOID,
    STICKBREAKING,
    T5,
    WALL,
    XL,
)

REFUSED = (
    NOPE,
    GLOBAL_SINUSOID,
    COPE,
    FOX,
    STICKBREAKING,
    PATH,
    WALL,
)  # they read no position index (or, global, s + i)
TAKES = tuple(name for name in SCHEME_NAMES if name not in REFUSED)
FUSED = (XL, T5, ALIBI, *naive.BIAS)
V = 23


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def model(name: str = ALIBI, P: int | None = 64, mem_len: int = 4, **cfg) -> MemoryTransformer:
    options = {LEARNED: {"max_positions": P or 16}}.get(
        name, sized_options(name, {HYBRID: HYBRID_OF_TWO}.get(name, {}), 6, mem_len)
    )
    return MemoryTransformer(
        ModelConfig(
            vocab_size=V,
            n_layer=2,
            d_model=16,
            n_head=2,
            d_inner=32,
            mem_len=mem_len,
            dropout=0.0,
            posenc=name,
            posenc_kwargs=options,
            random_positions=P,
            **cfg,
        )
    )


def gap_positions(L: int, M: int, P: int = 40, same_length: bool = False) -> Positions:
    """What the model builds: the index grid's visibility, positions an ordered random subset of [0, P)."""
    pos = make_positions(L, M, same_length)
    k = torch.randperm(P)[: L + M].sort().values
    return Positions(q=k[M:], k=k, offset=pos.offset, visible=pos.visible, consecutive=False)


def test_positions_are_an_ordered_random_subset_memory_first():
    m, L, M = model(P=50, same_length=True), 6, 4
    pos = m.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu"))
    assert not pos.consecutive and pos.k.shape == (M + L,) and torch.equal(pos.q, pos.k[M:])
    assert (pos.k.diff() > 0).all() and pos.k.min() >= 0 and pos.k.max() < 50  # distinct, sorted, in [0, P)
    assert (pos.k[:M] < pos.q.min()).all()  # memory keys before every query
    grid = model(P=None, same_length=True).positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu"))
    assert torch.equal(pos.visible, grid.visible)  # the same-length window counts keys, not positions
    redrawn = m.positions(L, M, torch.zeros(B, dtype=torch.long), torch.device("cpu"))
    assert not torch.equal(redrawn.k, pos.k)  # a new draw every segment


@pytest.mark.parametrize("name", REFUSED)
def test_schemes_that_read_no_index_refuse_with_their_reason(name):
    reason = SCHEMES[name].random_positions_refused
    assert reason
    with pytest.raises(ValueError, match=rf"random_positions=64 does not apply to posenc={name}: .*null"):
        model(name)


def hybrid(layers: list[str], n_layer: int = 2, windows: dict | None = None, P: int | None = 64) -> MemoryTransformer:
    options = {"layers": layers, "windows": windows, "options": None}
    cfg = dict(vocab_size=V, n_layer=n_layer, d_model=16, n_head=2, d_inner=32, mem_len=4, dropout=0.0)
    return MemoryTransformer(ModelConfig(**cfg, posenc=HYBRID, posenc_kwargs=options, random_positions=P))


@pytest.mark.parametrize(
    "layers, n_layer, built",
    [([NOPE], 2, NOPE), ([NOPE, FOX, WALL], 3, f"{NOPE}, {FOX}, {WALL}"), ([NOPE, NOPE], 1, NOPE)],
    ids=["nope", "nope-fox-wall", "a-repeated-pattern"],
)
def test_a_hybrid_whose_layers_read_no_position_refuses_them(layers, n_layer, built):
    """As a scheme that reads none: one line naming the layers it builds, before anything is built."""
    with pytest.raises(ValueError) as refused:
        hybrid(layers, n_layer)
    assert str(refused.value) == (
        f"model.random_positions=64 does not apply to posenc={HYBRID}: none of its layers reads a position (it "
        f"builds {built} layers, without a window, each of which refuses the option alone) (set "
        f"model.random_positions=null)"
    )
    hybrid(layers, n_layer, P=None)  # the same hybrid without the option builds


@pytest.mark.parametrize("layers, windows", [([ROPE, NOPE], None), ([NOPE, FOX], {NOPE: 3})], ids=["rope", "window"])
def test_a_hybrid_with_a_layer_that_reads_positions_takes_them(layers, windows):
    """A rope layer, or a window (its mask reads i - j), reads the drawn positions: the hybrid trains with them and
    two evaluation passes differ (a new draw each)."""
    m = hybrid(layers, windows=windows).train()
    x = torch.randint(V, (B, 6))
    out = m(x, x.roll(-1, 1))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    m.eval()
    with torch.no_grad():
        mems = m(x).mems
        assert (m(x, mems=mems).logits - m(x, mems=mems).logits).abs().max() > 1e-6


def test_bad_values_and_short_ranges_fail_before_compute():
    with pytest.raises(ValueError, match=r"model.random_positions must be an integer >= 1, got 2.5"):
        model(P=2.5)
    m = model(P=12, mem_len=8)
    with pytest.raises(ValueError, match=r"random_positions=12 is fewer than the 14 keys.*at least 14"):
        m.validate_lengths(6, 8)
    ran = []
    m.blocks[0].register_forward_hook(lambda *_: ran.append(1))
    with pytest.raises(ValueError, match=r"random_positions=12 is fewer than the 14 keys"):
        m(torch.randint(V, (B, 6)), mems=m(torch.randint(V, (B, 8))).mems)
    assert len(ran) == 1  # the first segment (8 keys) ran, the second (14) did not
    learned = model(LEARNED, P=64)
    learned.scheme.max_positions = 16
    with pytest.raises(ValueError, match=r"with model.random_positions=64: learned: position 63 .*max_positions=16"):
        learned.validate_lengths(6, 4)


@pytest.mark.parametrize("name", TAKES)
@pytest.mark.parametrize("L, M, same_length", [(5, 0, False), (4, 6, False), (5, 3, True)])
def test_gapped_positions_equal_the_naive_reference(name, L, M, same_length):
    """The unfused paths (xl and shaw gather per pair in place of the shift and the near diagonals)."""
    pos, (q, k, v) = gap_positions(L, M, same_length=same_length), qkv(L, M)
    if name in (SINUSOID, LEARNED):  # absolute: the input encoding reads the sampled query positions
        scheme, h = make_scheme(name), torch.randn(B, L, D)
        want = [scheme.table[p] if name == LEARNED else pe(int(p), D) for p in pos.q]  # P[i] or PE(i)
        torch.testing.assert_close(scheme.embed(h, pos), h + torch.stack(want), atol=1e-5, rtol=0)
        return
    if name == POPE:  # its own reference (tests/positional/test_pope.py)
        test_pope.assert_equals_naive(test_pope.new_scheme(), *(x.requires_grad_() for x in (q, k, v)), pos)
        return
    _assert_attend_equals_naive(name, "unfused", q, k, v, pos)


@pytest.mark.parametrize("name", FUSED)
def test_gapped_positions_on_the_fused_path(reference, name):  # noqa: F811
    """flex_attention (the uncompiled reference on CPU): each pair reads its column D - (q_i - k_j)."""
    pos, (q, k, v) = gap_positions(4, 6), qkv(4, 6)
    _assert_attend_equals_naive(name, "fused", q, k, v, pos)


def test_shaws_forced_fused_path_refuses_gaps(reference):  # noqa: F811
    scheme = make_scheme(SHAW)
    scheme.attention_impl = "fused"
    with pytest.raises(RuntimeError, match="consecutive positions.*random_positions"):
        q, k, v = qkv(4, 6)
        scheme.attend(AttentionInputs(1, q, k, gap_positions(4, 6), v=v))


@pytest.mark.parametrize("name", TAKES)
def test_every_scheme_that_takes_them_trains_and_evaluates(name):
    """Training with memory: finite loss and gradients. Evaluation draws positions too (the authors' code), so
    two evaluation passes differ; without the option they agree."""
    m = model(name, P=64).train()
    with torch.no_grad():  # zero-initialised tables (t5's bias, xl's u, v) would make the evaluation check vacuous
        for p in m.scheme.parameters():
            p.add_(0.5 * torch.randn_like(p))
    x = torch.randint(V, (2, B, 6))
    out = m(x[0], x[0].roll(-1, 1))
    out = m(x[1], x[1].roll(-1, 1), mems=out.mems, offset=6)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    m.eval()
    with torch.no_grad():
        a, b = m(x[1], mems=out.mems).logits, m(x[1], mems=out.mems).logits
        m.cfg.random_positions = None
        c, d = m(x[1], mems=out.mems).logits, m(x[1], mems=out.mems).logits
    assert (a - b).abs().max() > 1e-6 and torch.equal(c, d)


def test_the_option_reaches_training_from_the_command_line(tmp_path):
    """``+model.random_positions=P`` (the model presets do not list it) trains through Hydra and the
    LightningModule's length check; a range too short is refused by the config check, before anything is built."""
    from posenc_lab.train import train
    from tests.helpers_train import assert_finished_figures, compose_config, tiny

    run = tiny(tmp_path / "run", tmp_path / "cache", f"posenc={ROPE}", "+model.random_positions=256", steps=2)
    results = train(compose_config("train", run))
    assert results["steps"] == 2
    assert_finished_figures(results)
    short = tiny(tmp_path / "run2", tmp_path / "cache", f"posenc={ROPE}", "+model.random_positions=20", steps=2)
    with pytest.raises(ValueError, match=r"^model.random_positions=20 is fewer than the 32 keys of a segment"):
        train(compose_config("train", short))


def _assert_attend_equals_naive(name: str, impl: str, q, k, v, pos) -> None:
    """Scheme ``name`` on attention path ``impl`` (fused or unfused) against its naive reference at ``pos``."""
    scheme = (
        naive.new_scheme(name).train()
        if name in naive.CONTENT_FREE
        else make_scheme(name, **({"layers": [NOPE, ROPE]} if name == HYBRID else {})).train()
    )
    scheme.attention_impl = impl
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if name in naive.CONTENT_FREE:
        naive.assert_equals_naive(name, scheme, q, k, v, pos)
    else:  # a hybrid [nope, rope]: its layer 1 (the one attended) is rope
        reference = ROPE if name == HYBRID else name
        test_fused.assert_attend_equals_naive(reference, scheme, q, k, v, pos, [q, k, v])


@pytest.mark.parametrize("name", naive.DATA_DEPENDENT)
def test_a_data_dependent_scheme_reads_no_position_and_refuses_random_positions(name):
    assert SCHEMES[name].random_positions_refused and "no position" in SCHEMES[name].random_positions_refused
    assert "between" in SCHEMES[name].not_translation_invariant
