"""Positions the data gives: a learned embedding of each token's position id as the task assigns it, added to the
input beside whatever the scheme does (``model.data_positions``):

    h^0_i = sqrt(D) E[x_i] (+ the scheme's embedding) + sqrt(D) A[id_i]      A: [data_positions_size, D], learned

where id_i is the token's id of one kind (``data.corpus.position_ids``, ``posenc_lab.data.lengthgen``):

- ``abacus`` (McLeish et al. 2024, Abacus embeddings): 1 + a digit's index within its number, counted from the
  number's first written digit (the units, in their reversed format: ``addition_reversed``), 0 for every other
  token. Digits of one significance share an id in both operands and the sum.
- ``coupling`` (Cho et al. 2024, position coupling): the digits the model must line up share an id, n + 1 - k for
  significance k in operands and sum alike, the operators one past the units.

Both papers draw a random shift of the ids in training (McLeish's k in 0..max_k, Cho's random start), so that ids
past the trained lengths have been trained too; the data draws it per instance (``data.corpus.position_shift``),
since an instance read through the memory across segments must keep one shift, and gives test instances unshifted.
The authors add A to a model without other positional information (Abacus: NoPE or FIRE; coupling: in place of the
absolute table): here that is ``posenc=nope model.data_positions=abacus``, and any scheme may be beside it.

A is drawn as E is (N(0, 0.02)) and scaled as E is (by sqrt(D)), so that ids and tokens are learned at one scale:
unscaled, the table stayed about 20 times smaller than the token embedding in training and the model did not tell
neighbouring ids apart (benchmarks/results/, the lengthgen pilots of addition).

The ids enter with the tokens, so memory needs nothing more: a memory state carries the embedding its token had.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

KINDS = ("abacus", "coupling")


class DataPositionsError(LookupError):
    """The batch lacks the ids ``model.data_positions`` reads, or holds one past its table: a run set up wrongly,
    never a length a scheme cannot serve (what the analyses catch as a ValueError and report as such)."""


def data_positions_problem(kind, size) -> str | None:
    """Why ``model.data_positions=kind`` with a table of ``size`` rows cannot be built (one line), or None."""
    if kind is not None and kind not in KINDS:
        return f"model.data_positions must be null or one of {', '.join(KINDS)}, got {kind!r}"
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        return f"model.data_positions_size must be an integer >= 2 (ids 0..size-1), got {size!r}"
    return None


class DataPositions(nn.Module):
    """A: the learned table of the data's position ids of one kind (module doc)."""

    def __init__(self, kind: str, size: int, d_model: int):
        super().__init__()
        self.kind, self.size = kind, size
        self.table = nn.Parameter(torch.randn(size, d_model) * 0.02)

    def forward(self, h: Tensor, position_ids: dict[str, Tensor] | None, scale: float = 1.0) -> Tensor:
        """h: [B, L, D] the input embedding; position_ids: {kind: [B, L] int}, the batch's (``SegmentStream``);
        scale: the token embedding's (sqrt(D)), by which A is multiplied as E is."""
        if not position_ids or self.kind not in position_ids:
            given = ", ".join(sorted(position_ids or {})) or "none"
            raise DataPositionsError(
                f"model.data_positions={self.kind} reads the data's {self.kind} position ids, and this batch gives "
                f"{given}: train on a task with data.corpus.position_ids=true (the tasks with coupled ids: "
                f"addition, addition_reversed), or set model.data_positions=null"
            )
        ids = position_ids[self.kind]
        if (largest := int(ids.max())) >= self.size:  # one host read a segment: the table is never indexed past
            raise DataPositionsError(
                f"model.data_positions: position id {largest} is past the table of model.data_positions_size="
                f"{self.size} (ids 0..{self.size - 1}); raise model.data_positions_size to at least {largest + 1}"
            )
        return h + self.table[ids].to(h.dtype) * scale  # + sqrt(D) A[id_i]

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, size={self.size}"
