"""RoPE (Su et al. 2021): rotate q_i and k_j by angles proportional to their positions.

Pairs of channels (c, c + d_h/2) turn by angle p * theta_c, theta_c = base^{-2c/d_h}, so
q_i . k_j depends on i - j only. Memory keys sit at negative positions -M..-1.

``partial`` p (p-RoPE, Barbero et al. 2025) rotates only the R = floor(p d_h / 2) highest-frequency pairs,
c < R, with their own theta_c; the other pairs keep theta_c = 0 (never rotated: a position-free channel that
attention can use for content at any distance). p = 1 is RoPE, p = 0 no rotation at all. R rounds down as the
authors' Gemma code does (``int(rope_proportion * head_dim // 2)``).

``scaling`` stretches the rotation to evaluate past the trained length (``factor`` s >= 1 times it),
each a change of theta_c (and, for YaRN, of the scores' temperature):

    none    theta_c
    linear  theta_c / s                                     position interpolation (Chen et al. 2023)
    ntk     (base s^{d_h/(d_h-2)})^{-2c/d_h}                 NTK-aware: a larger base (bloc97, 2023)
    yarn    (1 - g_c) theta_c / s + g_c theta_c,  g_c = clip((r_c - alpha) / (beta - alpha), 0, 1),
            r_c = L_orig theta_c / (2 pi), alpha = 1, beta = 32; q and k times 0.1 ln(s) + 1  (Peng et al. 2023)
    llama3  the same blend with alpha = low_freq_factor, beta = high_freq_factor (1 and 4), no temperature
            (Llama 3.1's apply_scaling)
    dynamic (base a^{d_h/(d_h-2)})^{-2c/d_h},  a = max(1, s S / L_orig - (s - 1))          dynamic NTK (Hugging Face)
    longrope theta_c / f_c, f = short_factor if S <= L_orig else long_factor; q and k times
            attention_factor, null: sqrt(1 + ln(s) / ln(L_orig)) (1 at s = 1)        (LongRoPE, Phi-3; Ding et al. 2024)

r_c counts how many turns channel pair c makes over the trained span L_orig (``original_len``), i.e. L_orig over
its wavelength 2 pi / theta_c: pairs that turn many times (g = 1) keep theta, pairs that turn less than alpha
times (g = 0) are interpolated, those in between are blended; YaRN's temperature makes up for the flatter
softmax of the longer context. Llama 3.1's code states it by wavelength (kept below L_orig / high_freq_factor,
divided by s above L_orig / low_freq_factor, smooth = (L_orig / wavelength - low) / (high - low) between), which
is this ramp. L_orig is the attention span the model trained with, M + L (the largest distance it saw plus one);
null sizes it to the run, so a checkpoint carries it into evaluation (Llama 3.1's is 8192, its factor 8).
YaRN's alpha, beta and temperature are the paper's values for LLaMA.

``string_shift`` S turns on STRING at evaluation (An et al., ICLR 2025, "Why does the effective context length of
LLMs fall short?"): a training-free shift of the position indices, so that far pairs reuse the distances training
saw most often (the left-skewed frequency of relative positions). Each pair's distance d = i - j becomes

    d'  = d              d < S        (the local window keeps its positions)
    d'  = d - S + W      d >= S       (the far pairs shifted back by S - W: the S largest distances are dropped)

with W = ``string_window`` < S a small local window (the paper: S = N / 3 of the training length N, W = 128 at
N = 128K). The authors compute it as two flash-attention calls merged by their log-sum-exp (the neighbours with the
original positions, the rest with the queries' positions shifted by W - S); here the logits are written out, the far
pairs' with q rotated at i - S + W. Training ignores it (the scheme is plain rope while ``training``), so one
checkpoint is compared with and without it; memory keys are far or near by their distance like any other key.

dynamic and longrope read the span S of the segment being scored, the largest distance plus one,
S = q_{L-1} - k_0 + 1: M + L, memory keys included (a query's keys reach M back), the analogue of Hugging Face's
seq_len (the largest position + 1, which with a whole cache is also the largest distance + 1). S is read from the
positions' shapes, never from which memory slots are valid: a static memory (``posenc_lab.memory``) keeps M slots
from a stream's start, so the first segments use the full span's frequencies though fewer keys exist yet; one
graph and one set of frequencies per (M, L), no device read. At S <= L_orig dynamic is RoPE and longrope uses its
short factors; both are computed on the device (a tensor S), so random positions (gaps) need no host read either.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import AttentionInputs, Dims, PositionalScheme, Positions, Softmax, mask_to_bias
from .registry import register

SCALINGS = ("none", "linear", "ntk", "yarn", "llama3", "dynamic", "longrope")
SIZED = ("yarn", "llama3", "dynamic", "longrope")  # the scalings that read original_len
YARN_ALPHA, YARN_BETA = 1.0, 32.0


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def scaled_inv_freq(
    d_head: int,
    base: float,
    scaling: str,
    factor: float,
    original_len: int | None,
    partial: float = 1.0,
    ramp: tuple[float, float] = (YARN_ALPHA, YARN_BETA),
) -> Tensor:
    """[d_h/2] theta_c of ``scaling`` (see the module docstring); ``ramp``: llama3's (low, high) freq factors."""
    if scaling == "ntk":
        base = base * factor ** (d_head / (d_head - 2))
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)  # base^{-2c/d_h}
    if scaling == "linear":
        theta = theta / factor
    if scaling in ("yarn", "llama3"):
        alpha, beta = (YARN_ALPHA, YARN_BETA) if scaling == "yarn" else ramp
        turns = original_len * theta / (2 * math.pi)  # r_c
        keep = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)  # g_c
        theta = (1 - keep) * theta / factor + keep * theta
    rotated = int(partial * d_head // 2)  # R: the highest-frequency pairs c < R turn, the rest never do
    return torch.where(torch.arange(d_head // 2) < rotated, theta, 0.0)


def check_longrope(d_head: int, short: list | None, long: list | None, attention_factor: float | None) -> None:
    """One line naming the bad value if longrope's factors are not d_h/2 numbers > 0 each, or its attention factor
    not a number > 0 (or null)."""
    pairs = d_head // 2
    for option, factors in (("short_factor", short), ("long_factor", long)):
        if factors is None:
            raise ValueError(
                f"rope: scaling=longrope needs posenc.{option}, a list of d_h/2 = {pairs} numbers > 0 (one per channel "
                f"pair, theta_c divided by it: LongRoPE finds them by search, Phi-3's config ships them), got None"
            )
        if len(factors) != pairs or not all(math.isfinite(f) and f > 0 for f in factors):
            raise ValueError(
                f"rope: posenc.{option} must be d_h/2 = {pairs} numbers > 0 (one per channel pair), got {factors!r}"
            )
    if attention_factor is not None and not (math.isfinite(attention_factor) and attention_factor > 0):
        raise ValueError(
            f"rope: posenc.attention_factor must be a number > 0 or null (sqrt(1 + ln factor / ln original_len)), "
            f"got {attention_factor!r}"
        )


def check_string(shift: int | None, window: int | None) -> None:
    """One line naming the bad value unless STRING's shift S and window W are off together or 0 <= W < S."""
    if shift is None and window is None:
        return
    if shift is None:
        raise ValueError(f"rope: posenc.string_window={window!r} has no effect without posenc.string_shift (null: off)")
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 1:
        raise ValueError(
            f"rope: posenc.string_shift (STRING's S: distances from S on are shifted back by S - W; the paper: a third "
            f"of the training length) must be an integer >= 1 or null (off), got {shift!r}"
        )
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window < shift:
        raise ValueError(
            f"rope: posenc.string_window (STRING's local window W, the distance the first shifted pair takes) must be "
            f"an integer in [0, string_shift={shift}), got {window!r}"
        )


def longrope_attention_factor(factor: float, original_len: int, given: float | None) -> float:
    """The factor on q and on k (so the scores times its square): ``given``, else Hugging Face's default
    sqrt(1 + ln(s) / ln(L_orig)) for s > 1, and 1 at s = 1 (and at L_orig = 1, where ln L_orig = 0)."""
    if given is not None:
        return float(given)
    if factor <= 1 or original_len <= 1:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_len))


@register
class RoPE(PositionalScheme):
    name = "rope"
    kind = "relative"
    family = "relative, rotary"
    positions_enter = (
        "`q_i`, `k_j` rotated; `partial: p` rotates the fastest pairs only (p-RoPE); `scaling: linear, ntk, "
        "yarn, llama3, dynamic, longrope`; `string_shift`: STRING's shifted distances at evaluation"
    )
    with_memory = "memory at negative positions"
    own_attend_is_positions = True  # its attend writes STRING's shifted distances out, nothing else

    def __init__(
        self,
        dims: Dims,
        *,
        base: float = 10000.0,
        partial: float = 1.0,
        scaling: str = "none",
        factor: float = 1.0,
        original_len: int | None = None,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        short_factor: list[float] | None = None,
        long_factor: list[float] | None = None,
        attention_factor: float | None = None,
        string_shift: int | None = None,
        string_window: int | None = None,
    ):
        super().__init__(dims)
        check_string(string_shift, string_window)
        self.string_shift, self.string_window = string_shift, string_window
        if dims.d_head % 2:
            raise ValueError(f"rope: the head size d_model/n_head = {dims.d_head} is odd; rope needs an even head size")
        if not math.isfinite(base) or base <= 1:
            # base <= 0 gives NaN angles (the loss diverges at step 0), 1 the same angle for every channel pair
            raise ValueError(f"rope: posenc.base must be a number > 1 (10000 in Su et al. 2021), got {base!r}")
        if not 0 <= partial <= 1:
            raise ValueError(
                f"rope: posenc.partial (the fraction of channel pairs rotated: 1 = RoPE, 0 = none) must be in "
                f"[0, 1], got {partial!r}"
            )
        if scaling not in SCALINGS:
            raise ValueError(f"rope: scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
        if not factor >= 1:
            raise ValueError(f"rope: factor (how many times the trained length to reach) must be >= 1, got {factor!r}")
        if scaling == "none" and factor != 1:
            raise ValueError(
                f"rope: factor={factor!r} has no effect with scaling=none; pick one of {', '.join(SCALINGS[1:])}"
            )
        if scaling != "llama3" and (low_freq_factor, high_freq_factor) != (1.0, 4.0):
            raise ValueError(
                f"rope: low_freq_factor={low_freq_factor!r}, high_freq_factor={high_freq_factor!r} have no effect with "
                f"scaling={scaling}; they shape scaling=llama3"
            )
        if not 0 < low_freq_factor < high_freq_factor:
            raise ValueError(
                f"rope: llama3 needs 0 < low_freq_factor < high_freq_factor (Llama 3.1: 1 and 4), got "
                f"{low_freq_factor!r} and {high_freq_factor!r}"
            )
        if scaling != "longrope" and (short_factor, long_factor, attention_factor) != (None, None, None):
            raise ValueError(
                f"rope: short_factor={short_factor!r}, long_factor={long_factor!r}, attention_factor="
                f"{attention_factor!r} have no effect with scaling={scaling}; they shape scaling=longrope (null there)"
            )
        if scaling == "longrope":
            check_longrope(dims.d_head, short_factor, long_factor, attention_factor)
        if scaling in SIZED and (original_len is None or original_len < 1):
            raise ValueError(
                f"rope: scaling={scaling} needs original_len, the attention span trained with (M + L), "
                f"got {original_len!r}"
            )
        self.base, self.partial, self.scaling, self.factor = base, float(partial), scaling, float(factor)
        self.original_len, self.ramp = original_len, (float(low_freq_factor), float(high_freq_factor))
        inv_freq = scaled_inv_freq(dims.d_head, base, scaling, self.factor, original_len, self.partial, self.ramp)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # theta_c within the trained span
        # YaRN's temperature, sqrt(1/t) = 0.1 ln(s) + 1 on q and on k: the scores times (0.1 ln s + 1)^2
        self.qk_scale = 0.1 * math.log(self.factor) + 1.0 if scaling == "yarn" else 1.0
        self.short_factor, self.long_factor, self.attention_factor = short_factor, long_factor, attention_factor
        if scaling == "dynamic":  # theta_c a^{-2c/(d_h-2)} = (base a^{d_h/(d_h-2)})^{-2c/d_h}
            exponent = torch.arange(0, dims.d_head, 2, dtype=torch.float32) / (dims.d_head - 2)
            self.register_buffer("ntk_exponent", exponent, persistent=False)
        if scaling == "longrope":  # theta_c / f_c; inv_freq: the short factors' (the trained span's)
            self.register_buffer("long_inv_freq", inv_freq / torch.tensor(long_factor), persistent=False)
            self.inv_freq = inv_freq / torch.tensor(short_factor)
            self.qk_scale = longrope_attention_factor(self.factor, original_len, attention_factor)

    @classmethod
    def sized_options(cls, options: dict, segment_len: int, mem_len: int, max_offset: int = 0) -> dict:
        """original_len=None -> segment_len + mem_len, the span of keys the run trains with."""
        if options.get("original_len") is None:
            return {**options, "original_len": segment_len + mem_len}
        return dict(options)

    def frequencies(self, pos: Positions) -> Tensor:
        """[d_h/2] theta_c for this segment: ``inv_freq``, but for dynamic and longrope, which read the span
        S = q_{L-1} - k_0 + 1 (M + L with consecutive positions) as a device tensor (no host read)."""
        if self.scaling not in ("dynamic", "longrope"):
            return self.inv_freq
        span = (pos.q[-1] - pos.k[0] + 1).to(torch.float32)  # S
        if self.scaling == "dynamic":
            stretch = (self.factor * span / self.original_len - (self.factor - 1)).clamp(min=1.0)  # a
            return self.inv_freq * stretch**-self.ntk_exponent  # theta_c a^{-2c/(d_h-2)}
        return torch.where(span > self.original_len, self.long_inv_freq, self.inv_freq)  # long past L_orig

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype, theta: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """[P] positions -> cos, sin [P, d_h] of p theta_c (theta: ``inv_freq`` if None), times the qk scale."""
        theta = self.inv_freq if theta is None else theta
        angles = positions.to(torch.float32)[:, None] * theta  # [P, d_h/2]: p * theta_c
        angles = torch.cat([angles, angles], dim=-1)  # [P, d_h]
        return (angles.cos() * self.qk_scale).to(dtype), (angles.sin() * self.qk_scale).to(dtype)

    def rotate(
        self, layer: int, q: Tensor, k: Tensor, pos: Positions, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        theta = self.frequencies(pos)
        cos_q, sin_q = self._cos_sin(pos.q, q.dtype, theta)
        cos_k, sin_k = self._cos_sin(pos.k, k.dtype, theta)
        # x * cos + rotate_half(x) * sin  is the 2-D rotation of each channel pair.
        return q * cos_q + rotate_half(q) * sin_q, k * cos_k + rotate_half(k) * sin_k

    @property
    def string_active(self) -> bool:
        """STRING's shift applies: it is set and the model evaluates."""
        return self.string_shift is not None and not self.training

    def string_logits(self, q: Tensor, k: Tensor, pos: Positions, softmax: Softmax) -> Tensor:
        """q: [B, H, L, d_h], k: [B, H, N, d_h] -> [B, H, L, N] STRING's scaled logits, -inf where not visible: the
        near pairs (d < S) q_i rotated at i, the far ones at i - S + W (the module docstring), SSMax's scale applied."""
        theta, S, W = self.frequencies(pos), self.string_shift, self.string_window
        cos_k, sin_k = self._cos_sin(pos.k, k.dtype, theta)
        k = (k * cos_k + rotate_half(k) * sin_k).transpose(-1, -2) * q.shape[-1] ** -0.5
        near, far = (self._cos_sin(pos.q - shift, q.dtype, theta) for shift in (0, S - W))
        z_near, z_far = ((q * cos + rotate_half(q) * sin) @ k for cos, sin in (near, far))
        z = torch.where(pos.distance >= S, z_far, z_near)
        if softmax.scale is not None:
            z = z * softmax.scale.to(z.dtype)
        return z + mask_to_bias(pos.visible, z.dtype)

    def attention_probs(self, a: AttentionInputs) -> Tensor:
        if not self.string_active:
            return super().attention_probs(a)
        return a.softmax.unscaled().probs(self.string_logits(a.q, a.k, a.pos, a.softmax))

    def attend(self, a: AttentionInputs) -> Tensor:
        if not self.string_active:
            return super().attend(a)
        probs = self.attention_probs(a)
        return (F.dropout(probs, a.dropout_p) if a.dropout_p > 0 else probs) @ a.v

    def extra_repr(self) -> str:
        string = "" if self.string_shift is None else f", string_shift={self.string_shift}, window={self.string_window}"
        scaled = f", scaling={self.scaling!r}, factor={self.factor}" if self.scaling != "none" else ""
        partial = f", partial={self.partial}" if self.partial != 1 else ""
        return f"base={self.base}{partial}{scaled}{string}"
