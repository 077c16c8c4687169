"""RoPE scaling for evaluation past the trained span: linear (position interpolation), NTK-aware and YaRN,
against their formulas written per channel; bad values refused with the valid ones; and the option reaching
an evaluation of a trained checkpoint with no other edit."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_lab.positional import Dims, build_scheme, scheme_class, sized_options
from tests.schemes import ROPE
from tests.test_schemes import DH, D, H, make_positions, masked_softmax, qkv


def rope(**options):
    return build_scheme(ROPE, Dims(n_layer=1, d_model=D, n_head=H), **options)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: list[float]) -> torch.Tensor:
    """Each channel pair (c, c + d_h/2) turned by p theta_c, from the formula."""
    half = x.shape[-1] // 2
    ang = positions.double()[:, None] * torch.tensor(theta, dtype=torch.float64)
    cos, sin = ang.cos().float(), ang.sin().float()
    return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos], -1)


def naive_theta(scaling: str, s: float, L_orig: int, base: float = 10000.0, d: int = DH) -> list[float]:
    theta = [base ** (-2 * c / d) for c in range(d // 2)]
    if scaling == "linear":
        return [t / s for t in theta]
    if scaling == "ntk":
        return [(base * s ** (d / (d - 2))) ** (-2 * c / d) for c in range(d // 2)]
    if scaling == "yarn":
        out = []
        for t in theta:
            r = L_orig / (2 * math.pi / t)  # turns over the trained span: L_orig / wavelength
            g = 0.0 if r < 1 else 1.0 if r > 32 else (r - 1) / 31
            out.append((1 - g) * t / s + g * t)
        return out
    return theta


@pytest.mark.parametrize(
    "scaling, factor", [("none", 1.0), ("linear", 4.0), ("ntk", 4.0), ("yarn", 4.0), ("yarn", 1.0)]
)
def test_scaled_rotation_equals_the_formula(scaling, factor):
    """With memory (keys at -M..-1); YaRN also multiplies the scores by (0.1 ln s + 1)^2."""
    L_orig = 600  # at d_h = 4: r_0 = 95 turns (kept), r_1 = 0.95 (interpolated): both ends of the ramp
    scheme = rope(scaling=scaling, factor=factor, original_len=L_orig)
    pos, (q, k, v) = make_positions(5, 7), qkv(5, 7)
    theta = naive_theta(scaling, factor, L_orig)
    temperature = (0.1 * math.log(factor) + 1) ** 2 if scaling == "yarn" else 1.0
    scores = rotate(q, pos.q, theta) @ rotate(k, pos.k, theta).transpose(-1, -2) / math.sqrt(DH) * temperature
    with torch.no_grad():
        got = scheme.attend(0, q, k, v, pos, 0.0)
    torch.testing.assert_close(got, masked_softmax(scores, pos.visible) @ v, atol=1e-5, rtol=1e-5)


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


def test_yarn_keeps_the_fast_channels_and_interpolates_the_slow_ones():
    fast_slow = rope(scaling="yarn", factor=8.0, original_len=600).inv_freq
    plain = rope().inv_freq
    assert fast_slow[0] == plain[0] and fast_slow[1] == pytest.approx(plain[1] / 8)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"scaling": "dynamic"}, r"scaling must be one of none, linear, ntk, yarn, got 'dynamic'"),
        ({"scaling": "linear", "factor": 0.5}, r"factor .*must be >= 1, got 0.5"),
        ({"scaling": "ntk", "factor": True}, r"rope: posenc.factor must be a number, got True"),
        ({"factor": 2.0}, r"factor=2.0 has no effect with scaling=none"),
        ({"scaling": "yarn", "factor": 2.0}, r"scaling=yarn needs original_len.*got None"),
        ({"scaling": "yarn", "factor": 2.0, "original_len": 0}, r"needs original_len.*got 0"),
        ({"original_len": 12.5}, r"rope: posenc.original_len must be an integer or null, got 12.5"),
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
    ckpt = torch.load(results["checkpoint"], weights_only=False)
    assert ckpt["hyper_parameters"]["model"]["posenc_kwargs"]["original_len"] == 32
    with pytest.raises(ValueError, match="scaling must be one of"):
        evaluate_checkpoint(results["checkpoint"], max_batches=1, scheme_options={"scaling": "ntk-by-parts"})
