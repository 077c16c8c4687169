"""Side by side, run by hand (no project code imports it, no dependency of the project): posenc-lab's rope
scalings ``dynamic`` and ``longrope`` against Hugging Face's rope utilities, and its SSMax against the
``scalable-softmax`` package (an independent implementation; the paper's author publishes none).

    pip install transformers scalable-softmax      # into a venv of your own, not the project's
    python benchmarks/crosscheck_rope_scalings.py

Hugging Face's positions start at 0, ours at -M (memory keys): a rotation depends on differences only, so their
position ids are ours plus M, and their seq_len (the largest position id + 1) is our span M + L.
"""

from __future__ import annotations

import math

import scalable_softmax
import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from posenc_lab.positional import AttentionInputs, Dims, Positions, build_scheme
from posenc_lab.positional.base import Softmax
from posenc_lab.softmax_scale import SSMax

BASE = 10000.0
torch.manual_seed(0)


def hf_config(d_head: int, rope_type: str, original_len: int, max_len: int | None = None, **params) -> LlamaConfig:
    """A one-head Llama config whose rope is ``rope_type`` with ``params`` (transformers 5: ``rope_parameters``)."""
    rope = {"rope_type": rope_type, "rope_theta": BASE, **params}
    return LlamaConfig(
        hidden_size=d_head,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=d_head,
        max_position_embeddings=max_len or original_len,
        rope_parameters=rope,
    )


def positions(L: int, M: int) -> Positions:
    q, k = torch.arange(L), torch.arange(-M, L)
    return Positions(q=q, k=k, offset=torch.zeros(1, dtype=torch.long), visible=k[None, :] <= q[:, None])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs().clamp(min=1e-30)).max())


def ours(d_head: int, **options):
    return build_scheme("rope", Dims(1, d_head, 1), **options)


def dynamic_tables() -> float:
    print("== dynamic NTK: theta_c at span S (ours: frequencies(pos), M = S - L; HF: ROPE_INIT_FUNCTIONS, seq_len = S)")
    worst = 0.0
    for d_head in (8, 64, 128):
        for factor in (1.0, 2.0, 8.0):
            L_orig = 256
            config = hf_config(d_head, "dynamic", L_orig, factor=factor)
            scheme = ours(d_head, scaling="dynamic", factor=factor, original_len=L_orig)
            for span in (128, 256, 257, 384, 1024, 4096):
                hf, attention = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=span)
                mine = scheme.frequencies(positions(64, span - 64))
                worst = max(worst, rel(mine, hf))
                assert attention == 1.0
                print(f"d_h={d_head:3d} s={factor:3.0f} S={span:5d}: max rel diff {rel(mine, hf):.2e}")
    return worst


def longrope_factors(pairs: int) -> tuple[list[float], list[float]]:
    """Phi-3-like lists: short factors near 1, long ones rising from 1 to 40 towards the low frequencies."""
    short = [1.0 + 0.05 * c / pairs for c in range(pairs)]
    long = [float(40 ** (c / (pairs - 1))) for c in range(pairs)]
    return short, long


def longrope_tables() -> float:
    print("== longrope: theta_c and the attention factor (HF: original_max_position_embeddings = L_orig and "
          "max_position_embeddings = s L_orig, Phi-3's way of giving s)")  # fmt: skip
    worst = 0.0
    for d_head in (8, 96):
        short, long = longrope_factors(d_head // 2)
        for factor in (1.0, 4.0, 32.0):
            L_orig = 4096
            config = hf_config(
                d_head, "longrope", L_orig, max_len=int(factor * L_orig), short_factor=short, long_factor=long,
                original_max_position_embeddings=L_orig,
            )  # fmt: skip
            scheme = ours(d_head, scaling="longrope", factor=factor, original_len=L_orig, short_factor=short,
                          long_factor=long)  # fmt: skip
            for span in (1024, 4096, 4097, 16384):
                hf, attention = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=span)
                mine = scheme.frequencies(positions(64, span - 64))
                worst = max(worst, rel(mine, hf), abs(scheme.qk_scale - attention))
                print(
                    f"d_h={d_head:3d} s={factor:4.0f} S={span:5d}: theta max rel diff {rel(mine, hf):.2e}; "
                    f"attention factor ours {scheme.qk_scale:.6f} HF {attention:.6f}"
                )
    return worst


def attention_with_memory() -> float:
    """Our rope.attend over L queries and M memory keys against HF's rotary embedding module (its forward, with its
    dynamic update) applied at position ids 0..M+L-1 and the attention written out."""
    print("== attention with memory: ours (keys at -M..L-1) vs HF LlamaRotaryEmbedding at position ids 0..M+L-1")
    worst = 0.0
    d_head, L_orig = 16, 48
    short, long = longrope_factors(d_head // 2)
    cases = {
        "dynamic": ({"factor": 4.0}, {"factor": 4.0}),
        "longrope": (
            {"factor": 4.0, "short_factor": short, "long_factor": long},
            {"short_factor": short, "long_factor": long, "original_max_position_embeddings": L_orig},
        ),
    }
    for scaling, (mine_opts, hf_opts) in cases.items():
        for L, M in ((16, 0), (16, 32), (16, 112)):
            scheme = ours(d_head, scaling=scaling, original_len=L_orig, **mine_opts)
            max_len = int(4 * L_orig) if scaling == "longrope" else L_orig
            rotary = LlamaRotaryEmbedding(hf_config(d_head, scaling, L_orig, max_len=max_len, **hf_opts))
            q, k, v = torch.randn(1, 1, L, d_head), torch.randn(1, 1, M + L, d_head), torch.randn(1, 1, M + L, d_head)
            pos = positions(L, M)
            with torch.no_grad():
                got = scheme.attend(AttentionInputs(0, q, k, pos, v=v))
                cos, sin = rotary(v, torch.arange(M + L)[None])  # [1, M + L, d_h], the attention factor inside
                qr, _ = apply_rotary_pos_emb(q, q, cos[:, M:], sin[:, M:])
                _, kr = apply_rotary_pos_emb(k, k, cos, sin)
                scores = (qr @ kr.transpose(-1, -2) / math.sqrt(d_head)).masked_fill(~pos.visible, float("-inf"))
                want = torch.softmax(scores, -1) @ v
            diff = float((got - want).abs().max())
            worst = max(worst, diff)
            print(f"{scaling:8s} L={L} M={M:3d} (S={M + L:3d}, L_orig={L_orig}): max abs diff of outputs {diff:.2e}")
    return worst


def ssmax_rows() -> float:
    """Our SSMax (rope, with memory and a static memory's invalid slots) against scalable_softmax.ScalableSoftmax
    applied to each query's visible logits (its n: the size of the row it is given)."""
    print("== SSMax: ours vs scalable_softmax.ScalableSoftmax row by row (n = the visible keys of the row)")
    worst = 0.0
    H, d_head = 2, 8
    scheme = build_scheme("rope", Dims(1, H * d_head, H))
    for L, M, valid_slots in ((8, 0, 0), (8, 24, 24), (8, 24, 5)):
        for s in (0.43, 0.168, 1.0):  # the package refuses s <= 0 (ours takes any s)
            theirs = scalable_softmax.ScalableSoftmax(s=s, learn_scaling=True, bias=False)
            mine = SSMax(H)
            with torch.no_grad():
                mine.s.fill_(s)
            pos = positions(L, M)
            pos.valid = torch.arange(M + L) >= M - valid_slots
            pos.visible = pos.visible & pos.valid[None, :]
            q, k = torch.randn(1, H, L, d_head), torch.randn(1, H, M + L, d_head)
            with torch.no_grad():
                got = scheme.attention_probs(AttentionInputs(0, q, k, pos, softmax=Softmax(mine(pos))))
                qr, kr = scheme.rotate(0, q, k, pos)
                logits = qr @ kr.transpose(-1, -2) / math.sqrt(d_head)
                want = torch.zeros_like(got)
                for i in range(L):
                    seen = pos.visible[i]
                    want[:, :, i, seen] = theirs(logits[:, :, i, seen], dim=-1)
            diff = float((got - want).abs().max())
            worst = max(worst, diff)
            print(f"L={L} M={M:2d} valid memory slots={valid_slots:2d} s={s:+.3f}: max abs diff {diff:.2e}")
    return worst


if __name__ == "__main__":
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"scalable-softmax {getattr(scalable_softmax, '__version__', '0.1.5 (pip)')}")  # fmt: skip
    results = {
        "dynamic inv_freq (max rel)": dynamic_tables(),
        "longrope inv_freq and attention factor (max rel / abs)": longrope_tables(),
        "rope attention with memory (max abs)": attention_with_memory(),
        "ssmax probabilities (max abs)": ssmax_rows(),
    }
    print("== summary")
    for what, worst in results.items():
        print(f"{what}: {worst:.2e}")
