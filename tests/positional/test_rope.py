"""RoPE scaling for evaluation past the trained span: linear (position interpolation), NTK-aware, YaRN and
Llama 3.1's, and p-RoPE's partial rotation, against their formulas written per channel; bad values refused with
the valid ones; and the option reaching an evaluation of a trained checkpoint with no other edit."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.positional import Dims, build_scheme, scheme_class, sized_options
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


def naive_theta(
    scaling: str,
    s: float,
    L_orig: int,
    base: float = 10000.0,
    d: int = DH,
    partial: float = 1.0,
    low: float = 1.0,
    high: float = 4.0,
) -> list[float]:
    theta = [base ** (-2 * c / d) for c in range(d // 2)]
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
    got = scheme.attend(0, *got_in, pos, 0.0)
    scores = rotate(want_in[0], pos.q, theta) @ rotate(want_in[1], pos.k, theta).transpose(-1, -2) / math.sqrt(DH)
    want = masked_softmax(scores * temperature, pos.visible) @ want_in[2]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(got)
    got_grads = torch.autograd.grad((got * weights).sum(), got_in)
    for a, b in zip(got_grads, torch.autograd.grad((want * weights).sum(), want_in)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_linear_scaling_is_positions_divided_by_the_factor_and_yarn_at_one_is_none():
    pos, (q, k, v) = make_positions(4, 8), qkv(4, 8)
    divided = make_positions(4, 8)
    divided.q, divided.k = pos.q / 4, pos.k / 4
    with torch.no_grad():
        torch.testing.assert_close(
            rope(scaling="linear", factor=4.0).attend(0, q, k, v, pos, 0.0), rope().attend(0, q, k, v, divided, 0.0)
        )
        torch.testing.assert_close(
            rope(scaling="yarn", factor=1.0, original_len=64).attend(0, q, k, v, pos, 0.0),
            rope().attend(0, q, k, v, pos, 0.0),
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
        nope = build_scheme(NOPE, Dims(1, D, H)).attend(0, q, k, v, pos, 0.0)
        torch.testing.assert_close(rope(partial=0.0).attend(0, q, k, v, pos, 0.0), nope)


def test_yarn_keeps_the_fast_channels_and_interpolates_the_slow_ones():
    fast_slow = rope(scaling="yarn", factor=8.0, original_len=600).inv_freq
    plain = rope().inv_freq
    assert fast_slow[0] == plain[0] and fast_slow[1] == pytest.approx(plain[1] / 8)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"scaling": "dynamic"}, r"scaling must be one of none, linear, ntk, yarn, llama3, got 'dynamic'"),
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
    ckpt = torch.load(results["checkpoint"], weights_only=False)
    assert ckpt["hyper_parameters"]["model"]["posenc_kwargs"]["original_len"] == 32
    with pytest.raises(ValueError, match="scaling must be one of"):
        evaluate_checkpoint(results["checkpoint"], max_batches=1, scheme_options={"scaling": "ntk-by-parts"})
