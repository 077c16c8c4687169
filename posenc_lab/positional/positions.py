"""What a scheme is handed: the model's sizes (``Dims``) and where one segment's queries and keys sit
(``Positions``). Its own module, below both ``base.py`` and ``fused.py``, which read them."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Dims:
    """Sizes a scheme needs to build its parameters."""

    n_layer: int
    d_model: int
    n_head: int

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head


@dataclass
class Positions:
    """Where the queries and keys of one segment sit.

    q: [L] query positions i = 0..L-1.  k: [N] key positions j = -M..L-1, N = M + L.
    offset: [B] stream offset s of each stream's first token (tokens since its episode began).
    visible: [L, N] bool, True where key j may be attended by query i (causal, optional same-length).
    consecutive: True when the keys sit one position apart (k = -M..L-1, q = its last L), the layout the
    relative shift and the per-distance tables of ``fused.py`` index by; False under ``model.random_positions``
    (an ordered random subset with gaps: k[0] < k[1] < ... < k[N-1], q = k[M:]).
    valid: [N] bool, the keys that exist: a static memory's slots not yet filled since the episode began are not
    (``posenc_lab.memory``); already out of ``visible``, and a scheme that accumulates over keys gives them no
    share either. None: every key exists.
    """

    q: Tensor
    k: Tensor
    offset: Tensor
    visible: Tensor
    consecutive: bool = True
    valid: Tensor | None = None

    @property
    def distance(self) -> Tensor:
        """[L, N] relative distance d = i - j (>= 0 where visible)."""
        return self.q[:, None] - self.k[None, :]

    def shifted(self, by: int) -> Positions:
        """The same segment with every position moved by ``by`` (for invariance tests)."""
        return Positions(self.q + by, self.k + by, self.offset + by, self.visible, self.consecutive, self.valid)

    @property
    def max_distance(self) -> int:
        """The largest distance of the segment, q[-1] - k[0]: N - 1 when consecutive (read from the shapes), else
        read from the device (one sync), the length a per-distance table must cover."""
        return self.k.shape[0] - 1 if self.consecutive else int(self.q[-1] - self.k[0])
