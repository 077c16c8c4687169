"""RoPE scaling for evaluation past the trained span: linear (position interpolation), NTK-aware, YaRN,
Llama 3.1's, dynamic NTK and LongRoPE, and p-RoPE's partial rotation, against their formulas written per channel
(dynamic's and LongRoPE's as Hugging Face writes them); bad values refused with the valid ones; memory equal to one
long pass; and the option reaching an evaluation of a trained checkpoint with no other edit."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.positional import AttentionInputs, Dims, build_scheme, scheme_class, sized_options
from tests.positional.test_schemes import DH, D, H, make_positions, masked_softmax, qkv
from tests.schemes import ROPE


def rope(**options):
    return build_scheme(ROPE, Dims(n_layer=1, d_model=D, n_head=H), **options)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: list[float]) -> torch.Tensor:
    """Each channel pair (c, c + d_h/2) turned by p theta_c, from the formula."""
    half = x.shape[-1] // 2
    ang = positions.double()[:, None] * torch.tensor(theta, dtype=torch.float64)
    cos, sin = ang.cos().float(), ang.sin().float()
    return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos], -1)


LONGROPE = {"original_len": 8, "short_factor": [1.0, 1.25], "long_factor": [1.5, 6.0]}


def naive_theta(
    scaling: str,
    s: float,
    L_orig: int,
    base: float = 10000.0,
    d: int = DH,
    partial: float = 1.0,
    low: float = 1.0,
    high: float = 4.0,
    span: int | None = None,
) -> list[float]:
    """theta_c of ``scaling``; dynamic and longrope at the attention ``span`` (largest distance + 1)."""
    if scaling == "dynamic" and span > L_orig:  # Hugging Face's _compute_dynamic_ntk_parameters, seq_len = span
        base = base * ((s * span / L_orig) - (s - 1)) ** (d / (d - 2))
    theta = [base ** (-2 * c / d) for c in range(d // 2)]
    if scaling == "longrope":  # _compute_longrope_parameters: 1 / (ext_factors * base^{2c/d})
        factors = LONGROPE["long_factor"] if span > L_orig else LONGROPE["short_factor"]
        theta = [t / f for t, f in zip(theta, factors)]
    if scaling == "linear":
        theta = [t / s for t in theta]
    if scaling == "ntk":
        theta = [(base * s ** (d / (d - 2))) ** (-2 * c / d) for c in range(d // 2)]
    if scaling == "yarn":
        out = []
        for t in theta:
            r = L_orig / (2 * math.pi / t)  # turns over the trained span: L_orig / wavelength
            g = 0.0 if r < 1 else 1.0 if r > 32 else (r - 1) / 31
            out.append((1 - g) * t / s + g * t)
        theta = out
    if scaling == "llama3":  # Llama 3.1's apply_scaling, by wavelength (low_freq_factor, high_freq_factor)
        out = []
        for t in theta:
            wavelength = 2 * math.pi / t
            if wavelength < L_orig / high:
                out.append(t)
            elif wavelength > L_orig / low:
                out.append(t / s)
            else:
                smooth = (L_orig / wavelength - low) / (high - low)
                out.append((1 - smooth) * t / s + smooth * t)
        theta = out
    rotated = int(partial * d // 2)  # p-RoPE: the first (highest-frequency) pairs turn, the others never
    return [t if c < rotated else 0.0 for c, t in enumerate(theta)]


@pytest.mark.parametrize(
    "scaling, factor",
    [("none", 1.0), ("linear", 4.0), ("ntk", 4.0), ("yarn", 4.0), ("yarn", 1.0), ("llama3", 4.0), ("llama3", 8.0)],
)
@pytest.mark.parametrize("partial", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("M", [7, 0])
def test_scaled_rotation_equals_the_formula(scaling, factor, partial, M):
    """With memory (keys at -M..-1) and without; YaRN also multiplies the scores by (0.1 ln s + 1)^2. Forward and
    backward (q, k, v)."""
    L_orig = 600  # at d_h = 4: r_0 = 95 turns (kept), r_1 = 0.95 (interpolated): both ends of the ramp
    scheme = rope(scaling=scaling, factor=factor, original_len=L_orig, partial=partial)
    pos, (q, k, v) = make_positions(5, M), qkv(5, M)
    theta = naive_theta(scaling, factor, L_orig, partial=partial)
    temperature = (0.1 * math.log(factor) + 1) ** 2 if scaling == "yarn" else 1.0
    got_in, want_in = ([t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2))
    got = scheme.attend(AttentionInputs(0, got_in[0], got_in[1], pos, v=got_in[2]))
    scores = rotate(want_in[0], pos.q, theta) @ rotate(want_in[1], pos.k, theta).transpose(-1, -2) / math.sqrt(DH)
    want = masked_softmax(scores * temperature, pos.visible) @ want_in[2]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(got)
    got_grads = torch.autograd.grad((got * weights).sum(), got_in)
    for a, b in zip(got_grads, torch.autograd.grad((want * weights).sum(), want_in)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def attend_with_grads(scheme, pos, q, k, v, theta, temperature):
    """The scheme's attention and the formula's (rotation by ``theta``, scores times ``temperature``), with the
    gradients of q, k, v under one random weighting, for comparison."""
    got_in, want_in = ([t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2))
    got = scheme.attend(AttentionInputs(0, got_in[0], got_in[1], pos, v=got_in[2]))
    scores = rotate(want_in[0], pos.q, theta) @ rotate(want_in[1], pos.k, theta).transpose(-1, -2) / math.sqrt(DH)
    want = masked_softmax(scores * temperature, pos.visible) @ want_in[2]
    weights = torch.randn_like(got)
    grads = [torch.autograd.grad((x * weights).sum(), inputs) for x, inputs in ((got, got_in), (want, want_in))]
    return got, want, grads


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
@pytest.mark.parametrize("factor", [1.0, 4.0])
@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("L_orig", [8, 64])
@pytest.mark.parametrize("M", [7, 0])
def test_dynamic_and_longrope_equal_hugging_faces_formulas(scaling, factor, partial, L_orig, M):
    """At the span S = M + L (memory keys included): past L_orig (8) dynamic's base grows and longrope takes its
    long factors, within it (64) dynamic is RoPE and longrope takes the short ones; longrope's q and k times
    sqrt(1 + ln s / ln L_orig). Forward and backward (q, k, v)."""
    factors = {k: v for k, v in LONGROPE.items() if k != "original_len"} if scaling == "longrope" else {}
    scheme = rope(scaling=scaling, factor=factor, partial=partial, original_len=L_orig, **factors)
    L = 5
    pos, (q, k, v) = make_positions(L, M), qkv(L, M)
    theta = naive_theta(scaling, factor, L_orig, partial=partial, span=M + L)
    attention = math.sqrt(1 + math.log(factor) / math.log(L_orig)) if scaling == "longrope" else 1.0
    got, want, (got_grads, want_grads) = attend_with_grads(scheme, pos, q, k, v, theta, attention**2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if M + L > L_orig and factor > 1:  # the scaling acts: not RoPE's attention
        assert (got - rope().attend(AttentionInputs(0, q, k, pos, v=v))).abs().max() > 1e-3


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
def test_the_span_is_the_static_memorys_slots_not_its_valid_ones(scaling):
    """A static memory keeps M slots from a stream's start (posenc_lab/memory.py): S = M + L whichever are valid yet,
    so the frequencies (and the compiled graph) depend on the shapes alone. At a stream's start this is not the pass
    over the valid keys alone (S = valid + L): documented in docs/SCHEMES.md."""
    L, M, valid_slots = 5, 7, 2
    scheme = rope(scaling=scaling, factor=4.0, **(LONGROPE if scaling == "longrope" else {"original_len": 8}))
    pos, (q, k, v) = make_positions(L, M), qkv(L, M)
    pos.valid = torch.arange(M + L) >= M - valid_slots
    pos.visible = pos.visible & pos.valid[None, :]
    attention = math.sqrt(1 + math.log(4.0) / math.log(8)) if scaling == "longrope" else 1.0
    with torch.no_grad():
        got = scheme.attend(AttentionInputs(0, q, k, pos, v=v))
        for span, equal in ((M + L, True), (valid_slots + L, False)):
            theta = naive_theta(scaling, 4.0, 8, span=span)
            scores = rotate(q, pos.q, theta) @ rotate(k, pos.k, theta).transpose(-1, -2) / math.sqrt(DH)
            want = masked_softmax(scores * attention**2, pos.visible) @ v
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-5) == equal


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
def test_with_memory_equals_one_long_pass(scaling):
    """One layer, a full memory (M = 8 > L = 4): the last segment's logits equal those of one pass over the window
    the memory covers, whose span M + L is the same; the scaling acts (S = 12 > L_orig = 6)."""
    from tests.models import make_model

    options = {"scaling": scaling, "factor": 2.0, "original_len": 6}
    if scaling == "longrope":  # d_h = 8: 4 pairs
        options |= {"short_factor": [1.0, 1.0, 1.1, 1.2], "long_factor": [1.0, 1.5, 3.0, 8.0]}
    model = make_model(ROPE, n_layer=1, mem_len=8, randomize="all", posenc_kwargs=options)
    stream, L = torch.randint(0, 23, (2, 12)), 4
    with torch.no_grad():
        mems = None
        for t in range(3):
            out = model(stream[:, t * L : (t + 1) * L], mems=mems, offset=t * L)
            mems = out.mems
        window = model(stream, mem_len=0).logits[:, -L:]
        scaled, model.scheme = model.scheme, build_scheme(ROPE, Dims(1, 16, 2))
        unscaled = model(stream, mem_len=0).logits[:, -L:]
        model.scheme = scaled
    torch.testing.assert_close(out.logits, window, atol=1e-5, rtol=1e-4)
    assert (window - unscaled).abs().max() > 1e-3


def test_longrope_attention_factor_is_hugging_faces_default_unless_given():
    from posenc_lab.positional.rope import longrope_attention_factor

    assert longrope_attention_factor(4.0, 64, None) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    assert longrope_attention_factor(1.0, 64, None) == 1.0 and longrope_attention_factor(4.0, 64, 1.3) == 1.3
    assert rope(scaling="longrope", factor=4.0, **LONGROPE, attention_factor=1.3).qk_scale == 1.3


def test_linear_scaling_is_positions_divided_by_the_factor_and_yarn_at_one_is_none():
    pos, (q, k, v) = make_positions(4, 8), qkv(4, 8)
    divided = make_positions(4, 8)
    divided.q, divided.k = pos.q / 4, pos.k / 4
    with torch.no_grad():
        torch.testing.assert_close(
            rope(scaling="linear", factor=4.0).attend(AttentionInputs(0, q, k, pos, v=v)),
            rope().attend(AttentionInputs(0, q, k, divided, v=v)),
        )
        torch.testing.assert_close(
            rope(scaling="yarn", factor=1.0, original_len=64).attend(AttentionInputs(0, q, k, pos, v=v)),
            rope().attend(AttentionInputs(0, q, k, pos, v=v)),
        )


@pytest.mark.parametrize("low, high", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_blends_between_its_two_wavelengths(low, high):
    """d_h = 64, base 10000, L_orig 8192 (Llama 3.1's span at its head size): the pairs that turn more than
    ``high`` times keep theta, fewer than ``low`` times are divided by the factor, and those between (a few pairs)
    are Llama 3.1's blend, each pair against its formula by wavelength."""
    options = {"scaling": "llama3", "factor": 8.0, "original_len": 8192, "low_freq_factor": low}
    scheme = build_scheme(ROPE, Dims(1, 128, 2), **options, high_freq_factor=high)
    plain = build_scheme(ROPE, Dims(1, 128, 2)).inv_freq
    turns = 8192 * plain / (2 * math.pi)
    kept, divided = turns > high, turns < low
    between = ~kept & ~divided
    assert kept.any() and divided.any() and between.sum() >= 2
    want = torch.tensor(naive_theta("llama3", 8.0, 8192, d=64, low=low, high=high))
    torch.testing.assert_close(scheme.inv_freq, want, atol=0, rtol=1e-5)
    torch.testing.assert_close(scheme.inv_freq[kept], plain[kept])
    torch.testing.assert_close(scheme.inv_freq[divided], plain[divided] / 8)


def test_partial_rotation_leaves_the_low_frequencies_unrotated():
    """p-RoPE: R = floor(p d_h / 2) pairs turn (the first, fastest); an unrotated pair's product is position-free,
    and p = 0 is no rotation at all (NoPE's scores)."""
    quarter = build_scheme(ROPE, Dims(1, 128, 2), partial=0.25).inv_freq  # d_h = 64: 32 pairs, 8 turn
    plain = build_scheme(ROPE, Dims(1, 128, 2)).inv_freq
    assert torch.equal(quarter[:8], plain[:8]) and not quarter[8:].any()
    assert not build_scheme(ROPE, Dims(1, 128, 2), partial=0.24).inv_freq[7:].any()  # 7.68 pairs round down
    from tests.schemes import NOPE

    pos, (q, k, v) = make_positions(5, 7), qkv(5, 7)
    with torch.no_grad():
        nope = build_scheme(NOPE, Dims(1, D, H)).attend(AttentionInputs(0, q, k, pos, v=v))
        torch.testing.assert_close(rope(partial=0.0).attend(AttentionInputs(0, q, k, pos, v=v)), nope)


def test_yarn_keeps_the_fast_channels_and_interpolates_the_slow_ones():
    fast_slow = rope(scaling="yarn", factor=8.0, original_len=600).inv_freq
    plain = rope().inv_freq
    assert fast_slow[0] == plain[0] and fast_slow[1] == pytest.approx(plain[1] / 8)


@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"scaling": "ntk-by-parts"},
            r"scaling must be one of none, linear, ntk, yarn, llama3, dynamic, longrope, got 'ntk-by-parts'",
        ),
        ({"scaling": "dynamic", "factor": 2.0}, r"scaling=dynamic needs original_len.*got None"),
        (
            {"scaling": "longrope", "original_len": 8, "long_factor": [1.0, 2.0]},
            r"^rope: scaling=longrope needs posenc.short_factor, a list of d_h/2 = 2 numbers > 0 .*got None$",
        ),
        (
            {"scaling": "longrope", "original_len": 8, "short_factor": [1.0], "long_factor": [1.0, 2.0]},
            r"^rope: posenc.short_factor must be d_h/2 = 2 numbers > 0 \(one per channel pair\), got \[1.0\]$",
        ),
        (
            {"scaling": "longrope", "original_len": 8, "short_factor": [1.0, 1.0], "long_factor": [2.0, 0.0]},
            r"^rope: posenc.long_factor must be d_h/2 = 2 numbers > 0 .*got \[2.0, 0.0\]$",
        ),
        (
            {"scaling": "longrope", **LONGROPE, "attention_factor": -1.0},
            r"^rope: posenc.attention_factor must be a number > 0 or null .*got -1.0$",
        ),
        ({"scaling": "ntk", "factor": 2.0, "long_factor": [1.0, 2.0]}, r"have no effect with scaling=ntk"),
        ({"short_factor": "1,2"}, r"^rope: posenc.short_factor must be a list of numbers or null, got '1,2'$"),
        (
            {"long_factor": [1.0, True]},
            r"^rope: posenc.long_factor must be a list of numbers or null, got \[1.0, True\]$",
        ),
        ({"scaling": "linear", "factor": 0.5}, r"factor .*must be >= 1, got 0.5"),
        ({"scaling": "ntk", "factor": True}, r"rope: posenc.factor must be a number, got True"),
        ({"factor": 2.0}, r"factor=2.0 has no effect with scaling=none"),
        ({"scaling": "yarn", "factor": 2.0}, r"scaling=yarn needs original_len.*got None"),
        ({"scaling": "yarn", "factor": 2.0, "original_len": 0}, r"needs original_len.*got 0"),
        ({"original_len": 12.5}, r"rope: posenc.original_len must be an integer or null, got 12.5"),
        ({"partial": 1.5}, r"posenc.partial .*must be in \[0, 1\], got 1.5"),
        ({"partial": "half"}, r"rope: posenc.partial must be a number, got 'half'"),
        ({"scaling": "llama3", "factor": 8.0}, r"scaling=llama3 needs original_len.*got None"),
        (
            {"scaling": "yarn", "factor": 2.0, "original_len": 64, "high_freq_factor": 8.0},
            r"have no effect with scaling=yarn",
        ),
        (
            {"scaling": "llama3", "factor": 2.0, "original_len": 64, "low_freq_factor": 4.0},
            r"0 < low_freq_factor < high_freq_factor .*got 4.0 and 4.0",
        ),
    ],
)
def test_bad_scaling_options_are_refused_naming_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        rope(**options)


def test_original_len_is_the_trained_attention_span():
    assert sized_options(ROPE, {"original_len": None}, 64, 192) == {"original_len": 256}
    assert sized_options(ROPE, {"original_len": 100}, 64, 192) == {"original_len": 100}
    assert scheme_class(ROPE).sized_options({}, 8, 0) == {"original_len": 8}


def test_a_trained_checkpoint_evaluates_with_yarn_past_its_span(tmp_path):
    """Train rope (its original_len sized to 32 and kept in the checkpoint), then evaluate at twice the memory
    with scaling=yarn, factor=2, through the evaluation entry point's scheme options: no other edit."""
    from posenc_lab.evaluate import evaluate_checkpoint
    from posenc_lab.train import train
    from tests.helpers_train import compose_config, tiny

    results = train(compose_config("train", tiny(tmp_path / "run", tmp_path / "cache", f"posenc={ROPE}", steps=2)))
    plain = evaluate_checkpoint(results["checkpoint"], mem_len=48, max_batches=2)
    yarn = evaluate_checkpoint(
        results["checkpoint"], mem_len=48, max_batches=2, scheme_options={"scaling": "yarn", "factor": 2.0}
    )
    assert math.isfinite(yarn["loss"]) and yarn["loss"] != plain["loss"]
    llama3 = evaluate_checkpoint(
        results["checkpoint"], mem_len=48, max_batches=2, scheme_options={"scaling": "llama3", "factor": 2.0}
    )
    assert math.isfinite(llama3["loss"]) and llama3["loss"] not in (plain["loss"], yarn["loss"])
    dynamic = evaluate_checkpoint(
        results["checkpoint"], mem_len=48, max_batches=2, scheme_options={"scaling": "dynamic", "factor": 2.0}
    )
    assert math.isfinite(dynamic["loss"]) and dynamic["loss"] not in (plain["loss"], yarn["loss"], llama3["loss"])
    ckpt = torch.load(results["checkpoint"], weights_only=False)
    assert ckpt["hyper_parameters"]["model"]["posenc_kwargs"]["original_len"] == 32
    with pytest.raises(ValueError, match="scaling must be one of"):
        evaluate_checkpoint(results["checkpoint"], max_batches=1, scheme_options={"scaling": "ntk-by-parts"})
