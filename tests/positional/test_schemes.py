"""The positional schemes, one at a time, against the math of docs/SCHEMES.md.

Tests may materialise per-pair quantities the implementation must not: every naive reference here
loops over (query, key) pairs on small sizes and builds the sinusoid from its formula.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from pathlib import Path

import pytest
import torch
import yaml

import posenc_lab.positional as positional
from posenc_lab.positional import (
    SCHEME_NAMES,
    SCHEMES,
    AttentionInputs,
    Dims,
    Positions,
    build_scheme,
    scheme_options,
    schemes_of_kind,
    sinusoid_table,
    sized_options,
)
from posenc_lab.positional.xl import relative_shift
from tests.schemes import (
    ALIBI,
    COPE,
    FIRE,
    GLOBAL_SINUSOID,
    HYBRID,
    HYBRID_OF_TWO,
    LEARNED,
    NOPE,
    ROPE,
    SHAW,
    SINUSOID,
    STICKBREAKING,
    T5,
    XL,
)

ALL = SCHEME_NAMES
RELATIVE = schemes_of_kind("relative")
ABSOLUTE = schemes_of_kind("absolute")
CONF = Path(__file__).resolve().parents[2] / "conf" / "posenc"
# Options that make the interesting branches reachable at test sizes (clipping, log buckets, FIRE's
# interpolation past its threshold, CoPE's counts clamped at its maximum position).
OPTIONS = {
    SHAW: {"K": 2},
    T5: {"n_buckets": 8, "max_distance": 20},
    LEARNED: {"max_positions": 64},
    FIRE: {"init_threshold": 3.0},
    COPE: {"max_position": 6},
    HYBRID: HYBRID_OF_TWO,
}

B, H, D = 2, 4, 16
DH = D // H
# (L, M): no memory, M < L, M == L, M > L
LENGTHS = [(5, 0), (5, 3), (5, 5), (4, 9)]
# ... and with the same-length mask (needs memory)
MASKS = [(L, M, False) for L, M in LENGTHS] + [(L, M, True) for L, M in LENGTHS if M]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_scheme(name: str, n_layer: int = 2, **options) -> torch.nn.Module:
    scheme = build_scheme(name, Dims(n_layer=n_layer, d_model=D, n_head=H), **{**OPTIONS.get(name, {}), **options})
    with torch.no_grad():  # zero-initialised tables (t5 bias, xl u/v) would make tests vacuous
        for p in scheme.parameters():
            p.normal_(0.0, 0.5)
    return scheme.eval()


def make_positions(L: int, M: int, same_length: bool = False, offset: int = 0) -> Positions:
    """Built from the notation of docs/SCHEMES.md, independently of the model."""
    q, k = torch.arange(L), torch.arange(-M, L)
    visible = k[None, :] <= q[:, None]
    if same_length:
        visible &= k[None, :] >= q[:, None] - M
    return Positions(q=q, k=k, offset=torch.full((B,), offset, dtype=torch.long), visible=visible)


def qkv(L: int, M: int):
    return torch.randn(B, H, L, DH), torch.randn(B, H, M + L, DH), torch.randn(B, H, M + L, DH)


def inputs(L: int, M: int) -> torch.Tensor:
    """[B, M + L, D] a layer's input over the keys (what data-dependent schemes project: FoX's gates, PaTH's w)."""
    return torch.randn(B, M + L, D)


def pe(p: float, dim: int) -> torch.Tensor:
    """PE(p) from its formula, [sin ; cos] layout: sin(p / 10000^{2k/dim}) then cos(...)."""
    ang = [p / 10000 ** (2 * k / dim) for k in range(dim // 2)]
    return torch.tensor([math.sin(a) for a in ang] + [math.cos(a) for a in ang])


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


def test_a_scheme_is_one_module_and_one_yaml():
    """Every module of the package (but the interface and its positions, the registry, the fused path and DroPE's
    schedule, which any scheme takes) registers one scheme, found without an import list, and every scheme has
    conf/posenc/<name>.yaml naming it."""
    shared = {"base", "positions", "registry", "fused", "drope"}
    modules = {m.name for m in pkgutil.iter_modules(positional.__path__)} - shared
    by_module = {cls.__module__.rsplit(".", 1)[1]: name for name, cls in SCHEMES.items()}
    assert set(by_module) == modules and len(by_module) == len(SCHEMES) == len(SCHEME_NAMES)
    for name in SCHEME_NAMES:
        assert yaml.safe_load((CONF / f"{name}.yaml").read_text())["name"] == name
    assert set(RELATIVE) | set(ABSOLUTE) | set(schemes_of_kind("none")) == set(SCHEME_NAMES)
    assert not set(RELATIVE) & set(ABSOLUTE) and importlib.import_module("posenc_lab.positional") is positional


@pytest.mark.parametrize("name", ALL)
def test_build_scheme_by_name(name):
    options = HYBRID_OF_TWO if name == HYBRID else {}
    scheme = build_scheme(name, Dims(n_layer=2, d_model=D, n_head=H), **sized_options(name, options, 8, 4))
    assert scheme.name == name and scheme.kind in ("absolute", "relative", "none")


@pytest.mark.parametrize("name", ALL)
def test_lengths_left_null_are_sized_to_the_run(name):
    """Options the config leaves null (learned's table) are sized from the run's lengths; the sized scheme
    serves those lengths; options given stay as given."""
    conf = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    conf.pop("name")
    for L, M in [(8, 4), (40, 0)]:
        options = sized_options(name, conf, L, M)
        assert {k for k, v in conf.items() if v is not None} <= set(options)
        assert all(options[k] == v for k, v in conf.items() if v is not None)
        build_scheme(name, Dims(n_layer=4, d_model=D, n_head=H), **options).validate(L, M)  # 4: the hybrid's pattern


def test_learned_table_defaults_to_the_segment_length():
    assert sized_options(LEARNED, {"max_positions": None}, 24, 100) == {"max_positions": 24}
    assert sized_options(LEARNED, {"max_positions": 7}, 24, 100) == {"max_positions": 7}
    with pytest.raises(ValueError, match="max_positions=None must be sized"):
        build_scheme(LEARNED, Dims(1, D, H))


def test_unknown_scheme_lists_valid_names():
    with pytest.raises(ValueError, match="bogus") as info:
        build_scheme("bogus", Dims(1, D, H))
    for name in ALL:
        assert name in str(info.value)


@pytest.mark.parametrize("name", ALL)
def test_unknown_option_is_named_with_the_valid_ones(name):
    with pytest.raises(ValueError, match="no_such_option") as info:
        build_scheme(name, Dims(1, D, H), no_such_option=1)
    for option in scheme_options(name):
        assert option in str(info.value)


def test_documented_options_exist():
    assert set(scheme_options(XL)) == {"clamp_len", "share_uv"}
    assert set(scheme_options(SHAW)) == {"K"}
    assert set(scheme_options(LEARNED)) == {"max_positions", "overflow"}
    assert set(scheme_options(T5)) == {"n_buckets", "max_distance"}
    assert set(scheme_options(ROPE)) == {
        "base",
        "scaling",
        "factor",
        "original_len",
        "partial",
        "low_freq_factor",
        "high_freq_factor",
        "short_factor",
        "long_factor",
        "attention_factor",
        "string_shift",
        "string_window",
    }


@pytest.mark.parametrize(
    "name, options, match",
    [
        (SHAW, {"K": 0}, "K.*got 0"),
        (SHAW, {"K": -2}, "K.*got -2"),
        (SHAW, {"K": 1.5}, "K.*got 1.5"),
        (LEARNED, {"max_positions": 0}, "max_positions.*got 0"),
        (LEARNED, {"max_positions": 8, "overflow": "wrap"}, "overflow.*'wrap'"),
        (XL, {"clamp_len": -1}, "clamp_len.*got -1"),
        (T5, {"n_buckets": 8, "max_distance": 4}, "max_distance=4"),
    ],
)
def test_bad_options_raise_naming_the_value(name, options, match):
    with pytest.raises(ValueError, match=match):
        build_scheme(name, Dims(1, D, H), **options)


def test_rope_rejects_odd_head_size():
    with pytest.raises(ValueError, match="head size.*3"):
        build_scheme(ROPE, Dims(n_layer=1, d_model=12, n_head=4))


# --------------------------------------------------------------------------------------------
# Input encodings
# --------------------------------------------------------------------------------------------


def test_sinusoid_table_is_the_formula():
    positions = torch.tensor([0, 1, 7, 123])
    table = sinusoid_table(positions, D)
    for row, p in zip(table, positions.tolist()):
        torch.testing.assert_close(row, pe(p, D), atol=1e-5, rtol=0)


def test_sinusoid_adds_pe_of_the_segment_position_and_ignores_offset():
    scheme, h = make_scheme(SINUSOID), torch.randn(B, 5, D)
    out = scheme.embed(h, make_positions(5, 3, offset=40))
    expected = h + torch.stack([pe(i, D) for i in range(5)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_global_sinusoid_adds_pe_of_offset_plus_position():
    scheme, h = make_scheme(GLOBAL_SINUSOID), torch.randn(B, 5, D)
    pos = make_positions(5, 3)
    pos.offset = torch.tensor([0, 40])
    out = scheme.embed(h, pos)
    for b, s in enumerate((0, 40)):
        expected = h[b] + torch.stack([pe(s + i, D) for i in range(5)])
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=0)


def test_learned_adds_its_table_row():
    scheme, h = make_scheme(LEARNED), torch.randn(B, 5, D)
    torch.testing.assert_close(scheme.embed(h, make_positions(5, 0, offset=9)), h + scheme.table[:5])


@pytest.mark.parametrize("name", RELATIVE + schemes_of_kind("none"))
def test_relative_schemes_leave_the_input_alone(name):
    h = torch.randn(B, 5, D)
    assert torch.equal(make_scheme(name).embed(h, make_positions(5, 3, offset=7)), h)


def test_learned_past_its_table_fails_naming_position_and_size():
    scheme = make_scheme(LEARNED, max_positions=8)
    scheme.validate(segment_len=8, mem_len=100, max_offset=10_000)  # reset per segment: only L matters
    with pytest.raises(ValueError, match=r"position 8\b.*max_positions=8"):
        scheme.validate(segment_len=9, mem_len=0)
    with pytest.raises(ValueError, match=r"position 11\b.*max_positions=8"):
        scheme.embed(torch.zeros(B, 12, D), make_positions(12, 0))


def test_learned_clamp_overflow_reuses_the_last_row_when_asked():
    scheme = make_scheme(LEARNED, max_positions=8, overflow="clamp")
    scheme.validate(segment_len=12, mem_len=0)
    out = scheme.embed(torch.zeros(B, 12, D), make_positions(12, 0))
    torch.testing.assert_close(out[0, :8], scheme.table)
    torch.testing.assert_close(out[0, 8:], scheme.table[-1].expand(4, D))


# --------------------------------------------------------------------------------------------
# Attention against naive per-pair references
# --------------------------------------------------------------------------------------------


def naive_xl(scheme, layer, q, k, v, pos):
    """A_ij = (q_i + u).k_j + (q_i + v).(W_kR PE(min(i - j, clamp))), / sqrt(d_h), per pair."""
    u, vb = (scheme.u, scheme.v) if scheme.share_uv else (scheme.u[layer], scheme.v[layer])
    L, N = pos.visible.shape
    ac, bd = torch.zeros(B, H, L, N), torch.zeros(B, H, L, N)
    for i in range(L):
        for j in range(N):
            if not pos.visible[i, j]:
                continue
            d = int(pos.q[i] - pos.k[j])
            if scheme.clamp_len is not None:
                d = min(d, scheme.clamp_len)
            r = scheme.w_kr[layer](pe(d, D)).view(H, DH)  # W_{k,R} R_d, per head
            ac[:, :, i, j] = ((q[:, :, i] + u) * k[:, :, j]).sum(-1) / math.sqrt(DH)  # (a) + (c)
            bd[:, :, i, j] = ((q[:, :, i] + vb) * r).sum(-1) / math.sqrt(DH)  # (b) + (d)
    probs = masked_softmax(ac + bd, pos.visible)
    return probs, probs @ v, bd


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("clamp_len", [None, 2])
@pytest.mark.parametrize("share_uv", [True, False])
def test_xl_relative_shift_equals_naive_per_pair(L, M, same_length, clamp_len, share_uv):
    scheme = make_scheme(XL, clamp_len=clamp_len, share_uv=share_uv)
    pos = make_positions(L, M, same_length)
    q, k, v = qkv(L, M)
    layer = 1
    with torch.no_grad():
        probs, out, naive_bd = naive_xl(scheme, layer, q, k, v, pos)
        # the shifted (b)+(d) term alone, on the visible pairs
        bd = relative_shift(scheme.position_scores(layer, q, pos)) / math.sqrt(DH)
        vis = pos.visible.expand(B, H, L, M + L)
        torch.testing.assert_close(bd[vis], naive_bd[vis], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(scheme.attend(AttentionInputs(layer, q, k, pos, v=v)), out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            scheme.attention_probs(AttentionInputs(layer, q, k, pos)), probs, atol=1e-5, rtol=1e-5
        )


def test_xl_relative_shift_layout():
    """Column c of the input holds distance N-1-c; after the shift (i, j) holds M + i - j."""
    L, M = 3, 2
    N = M + L
    x = (N - 1 - torch.arange(N)).float().expand(L, N)
    shifted = relative_shift(x)
    i, j = torch.arange(L)[:, None], torch.arange(N)[None, :]
    valid = j <= M + i
    assert torch.equal(shifted[valid], (M + i - j).float().expand(L, N)[valid])


def test_xl_clamp_len_changes_far_scores_only():
    L, M = 4, 6
    q, k, v = qkv(L, M)
    pos = make_positions(L, M)
    free, clamped = make_scheme(XL), make_scheme(XL, clamp_len=3)
    clamped.load_state_dict(free.state_dict())
    with torch.no_grad():
        a, b = (
            free.attention_probs(AttentionInputs(0, q, k, pos)),
            clamped.attention_probs(AttentionInputs(0, q, k, pos)),
        )
    assert not torch.allclose(a, b)
    assert make_scheme(XL).distances(pos).max() == M + L - 1
    assert clamped.distances(pos).max() == 3


def naive_shaw(scheme, layer, q, k, v, pos):
    """e_ij = q_i.(k_j + a^K_{clip(j-i)}) / sqrt(d_h); z_i = sum_j p_ij (v_j + a^V_{clip(j-i)})."""
    K = scheme.K
    aK, aV = scheme.a_key[layer], scheme.a_value[layer]
    L, N = pos.visible.shape
    scores = torch.zeros(B, H, L, N)
    rows = {}
    for i in range(L):
        for j in range(N):
            c = max(-K, min(K, int(pos.k[j] - pos.q[i]))) + K
            rows[i, j] = c
            scores[:, :, i, j] = (q[:, :, i] * (k[:, :, j] + aK[c])).sum(-1) / math.sqrt(DH)
    probs = masked_softmax(scores, pos.visible)
    out = torch.zeros(B, H, L, DH)
    for i in range(L):
        for j in range(N):
            out[:, :, i] += probs[:, :, i, j, None] * (v[:, :, j] + aV[rows[i, j]])
    return probs, out


@pytest.mark.parametrize("L, M, same_length", MASKS)
@pytest.mark.parametrize("K", [1, 2, 16])
def test_shaw_buckets_equal_naive_per_pair_with_clipping(L, M, same_length, K):
    scheme = make_scheme(SHAW, K=K)
    pos = make_positions(L, M, same_length)
    q, k, v = qkv(L, M)
    with torch.no_grad():
        probs, out = naive_shaw(scheme, 1, q, k, v, pos)
        torch.testing.assert_close(scheme.attention_probs(AttentionInputs(1, q, k, pos)), probs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(scheme.attend(AttentionInputs(1, q, k, pos, v=v)), out, atol=1e-5, rtol=1e-5)


def test_shaw_value_term_matters_and_only_k_plus_one_rows_are_used():
    scheme, (L, M) = make_scheme(SHAW, K=2), (5, 5)
    pos, (q, k, v) = make_positions(L, M), qkv(L, M)
    with torch.no_grad():
        base = scheme.attend(AttentionInputs(0, q, k, pos, v=v))
        scheme.a_value[0, 3:] += 10.0  # rows for j - i > 0: future keys only, never visible
        scheme.a_key[0, 3:] += 10.0
        assert torch.equal(scheme.attend(AttentionInputs(0, q, k, pos, v=v)), base)
        scheme.a_value[0, 0] += 1.0  # the row every distance >= K collapses onto
        assert not torch.allclose(scheme.attend(AttentionInputs(0, q, k, pos, v=v)), base)


def rope_rotate(x, positions, base=10000.0):
    """Rotate each channel pair (c, c + d_h/2) by angle p * base^(-2c/d_h), per position."""
    half = x.shape[-1] // 2
    theta = base ** (-2 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    ang = positions.double()[:, None] * theta
    cos, sin = ang.cos().float(), ang.sin().float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def naive_t5_bucket(d: int, n: int, max_distance: int) -> int:
    exact = n // 2
    if d < exact:
        return d
    return min(n - 1, exact + int(math.log(d / exact) / math.log(max_distance / exact) * (n - exact)))


def naive_scores(name, scheme, q, k, pos):
    """Scaled scores of the schemes whose output is softmax(scores) @ v."""
    if name == ROPE:
        q, k = rope_rotate(q, pos.q), rope_rotate(k, pos.k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(DH)
    dist = pos.q[:, None] - pos.k[None, :]
    if name == ALIBI:
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])  # H = 4: 1/4, 1/16, ...
        scores = scores - slopes[:, None, None] * dist
    if name == T5:
        buckets = [[naive_t5_bucket(max(int(d), 0), 8, 20) for d in row] for row in dist]
        scores = scores + scheme.bias[torch.tensor(buckets)].permute(2, 0, 1)
    return scores


@pytest.mark.parametrize("name", [NOPE, SINUSOID, LEARNED, GLOBAL_SINUSOID, ROPE, ALIBI, T5])
@pytest.mark.parametrize("L, M", LENGTHS)
def test_sdpa_schemes_equal_naive_scores(name, L, M):
    scheme = make_scheme(name)
    pos = make_positions(L, M, offset=3)
    q, k, v = qkv(L, M)
    with torch.no_grad():
        probs = masked_softmax(naive_scores(name, scheme, q, k, pos), pos.visible)
        torch.testing.assert_close(scheme.attention_probs(AttentionInputs(0, q, k, pos)), probs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(scheme.attend(AttentionInputs(0, q, k, pos, v=v)), probs @ v, atol=1e-5, rtol=1e-5)


def test_t5_buckets():
    from posenc_lab.positional.t5 import t5_bucket

    d = torch.arange(0, 200)
    got = t5_bucket(d, 8, 20)
    assert got.tolist() == [naive_t5_bucket(x, 8, 20) for x in d.tolist()]
    assert got[:4].tolist() == [0, 1, 2, 3]  # exact near
    assert (got.diff() >= 0).all() and got.max() == 7 and (got[20:] == 7).all()
    assert len(set(got[4:20].tolist())) > 1  # log buckets in between, not one


# --------------------------------------------------------------------------------------------
# Shift invariance and masking
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RELATIVE + schemes_of_kind("none"))
@pytest.mark.parametrize("L, M", LENGTHS)
@pytest.mark.parametrize("shift", [7, -3, 50])
def test_relative_schemes_are_shift_invariant(name, L, M, shift):
    scheme = make_scheme(name)
    pos = make_positions(L, M, offset=2)
    q, k, v = qkv(L, M)
    x = inputs(L, M)
    with torch.no_grad():
        for layer in (0, 1):
            torch.testing.assert_close(
                scheme.attention_probs(AttentionInputs(layer, q, k, pos.shifted(shift), context=x)),
                scheme.attention_probs(AttentionInputs(layer, q, k, pos, context=x)),
                atol=1e-5,
                rtol=1e-5,
            )
            torch.testing.assert_close(
                scheme.attend(AttentionInputs(layer, q, k, pos.shifted(shift), v=v, context=x)),
                scheme.attend(AttentionInputs(layer, q, k, pos, v=v, context=x)),
                atol=1e-5,
                rtol=1e-5,
            )


@pytest.mark.parametrize("name", RELATIVE)
def test_relative_schemes_do_use_distance(name):
    """Non-vacuity: the same content at other distances scores differently than with no encoding."""
    L, M = 5, 3
    pos, (q, k, v), x = make_positions(L, M), qkv(L, M), inputs(L, M)
    with torch.no_grad():
        plain = make_scheme(NOPE).attend(AttentionInputs(0, q, k, pos, v=v, context=x))
        assert not torch.allclose(make_scheme(name).attend(AttentionInputs(0, q, k, pos, v=v, context=x)), plain)


@pytest.mark.parametrize("name", ABSOLUTE)
def test_absolute_input_depends_on_positions(name):
    h, pos, scheme = torch.randn(B, 5, D), make_positions(5, 0), make_scheme(name)
    assert not torch.allclose(scheme.embed(h, pos.shifted(4)), scheme.embed(h, pos))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("same_length", [False, True])
def test_attention_probs_are_a_distribution_over_visible_keys(name, same_length):
    L, M = 5, 4
    scheme, pos, (q, k, _) = make_scheme(name), make_positions(L, M, same_length), qkv(L, M)
    with torch.no_grad():
        probs = scheme.attention_probs(AttentionInputs(0, q, k, pos, context=inputs(L, M)))
    assert probs.shape == (B, H, L, M + L)
    assert (probs[..., ~pos.visible] == 0).all()
    if name == STICKBREAKING:  # weights summing to 1 - the stick left over; a query's own key has none
        left = scheme.breaks(q, k, pos)[1]
        torch.testing.assert_close(probs.sum(-1) + left, torch.ones(B, H, L))
        own = pos.k[None, :] == pos.q[:, None]
        assert (probs[..., own] == 0).all() and (probs[..., pos.visible & ~own] > 0).all()
        return
    torch.testing.assert_close(probs.sum(-1), torch.ones(B, H, L))
    assert (probs[..., pos.visible] > 0).all()


def test_shaw_attend_with_fp32_probabilities_and_bf16_values(monkeypatch):
    """What CUDA autocast hands Shaw's value step: the softmax in fp32, v in bf16. Forward and the
    hand-written backward run (one dtype inside) and agree with the fp32 computation to bf16 precision."""
    scheme, pos = make_scheme(SHAW), make_positions(6, 5)
    q, k, v = qkv(6, 5)
    want = naive_shaw(scheme, 1, q, k, v, pos)[1]
    fp32_probs = scheme.attention_probs
    monkeypatch.setattr(
        scheme,
        "attention_probs",
        lambda *a, **kw: fp32_probs(*(x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in a)),
    )
    v16 = v.bfloat16().requires_grad_()
    out = scheme.attend(AttentionInputs(1, q.bfloat16(), k.bfloat16(), pos, v=v16))
    out.float().sum().backward()
    torch.testing.assert_close(out.float(), want, atol=0.05, rtol=0.05)
    assert v16.grad is not None and v16.grad.dtype == torch.bfloat16 and scheme.a_value.grad is not None


@pytest.mark.parametrize("name", schemes_of_kind("relative"))
def test_translation_invariance_holds_unless_declared(name):
    """Same content at the same distance, moved later in the sequence: a scheme that promises translation
    invariance scores the pair the same (the difference of two log-probabilities of one row is a difference of
    scores); FIRE (past its threshold) and CoPE (other keys in between) declare that they do not, and do not."""
    # FIRE past its threshold; stick-breaking with its own key (distance 0) taking a share
    options = {FIRE: {"init_threshold": 1.0}, STICKBREAKING: {"attend_current": True}}.get(name, {})
    torch.manual_seed(0)
    scheme, (L, M) = make_scheme(name, **options), (8, 0)
    pos, (q, k, _) = make_positions(L, M), qkv(L, M)
    t = 3
    q[:, :, 2 + t] = q[:, :, 2]  # query 2 and query 5 alike, and their keys at distances 0 and 2 alike
    k[:, :, 2 + t], k[:, :, t] = k[:, :, 2], k[:, :, 0]
    with torch.no_grad():
        logp = scheme.attention_probs(AttentionInputs(0, q, k, pos, context=inputs(L, M))).log()
    early, late = logp[..., 2, 2] - logp[..., 2, 0], logp[..., 2 + t, 2 + t] - logp[..., 2 + t, t]
    if SCHEMES[name].not_translation_invariant is None:
        torch.testing.assert_close(late, early, atol=1e-5, rtol=1e-5)
    else:
        assert (late - early).abs().max() > 1e-3, SCHEMES[name].not_translation_invariant
