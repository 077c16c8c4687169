"""The memory carried from segment to segment: always M slots per layer, with a validity mask (static shapes).

A stream's memory is empty at its start and after every episode reset, then fills up to M states. Rather
than growing (a new shape, hence a new compiled graph, every segment until it is full), it always holds M
slots per layer; ``valid`` says which of them hold states. The valid slots are always the newest ones (a
suffix): a reset marks every slot invalid, and each segment shifts its L states in at the end. Invalid
slots take no part in anything: the model removes them from every query's visible keys, and the schemes
that accumulate over keys (FoX's gates, PaTH's transforms) give them no share, so a segment scores exactly
as with a memory of only its valid slots (tests/test_static_memory.py pins it for every scheme).

``Recurrence`` is the one loop step that training, validation, test, the benchmark and the analyses share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass
class Memory:
    """states: n_layer x [B, M, D] (detached), each layer's input of the last M positions, oldest first;
    valid: [M] bool, True where a slot holds a state (a suffix; shared by the streams, which reset together)."""

    states: list[Tensor]
    valid: Tensor

    @property
    def slots(self) -> int:
        return self.valid.shape[0]

    @classmethod
    def empty(cls, n_layer: int, batch: int, slots: int, d_model: int, dtype, device) -> Memory:
        """M = ``slots`` slots per layer, none valid (a stream's start)."""
        states = [torch.zeros(batch, slots, d_model, dtype=dtype, device=device) for _ in range(n_layer)]
        return cls(states, torch.zeros(slots, dtype=torch.bool, device=device))

    @classmethod
    def of(cls, states: list[Tensor], slots: int) -> Memory:
        """Explicit states [B, M', D] (all valid, as a checkpoint keeps them) as ``slots`` slots: the newest
        ``slots`` if M' > slots, else padded in front with invalid zero slots."""
        have = states[0].shape[1]
        keep = min(have, slots)
        valid = torch.arange(slots, device=states[0].device) >= slots - keep
        padded = [torch.nn.functional.pad(s[:, have - keep :], (0, 0, slots - keep, 0)) for s in states]
        return cls(padded, valid)

    def reset(self, flag: Tensor) -> Memory:
        """Every slot invalid where ``flag`` (a bool tensor []) is True; on the device, no host read."""
        return Memory(self.states, self.valid & ~flag.to(self.valid.device))

    def valid_states(self) -> list[Tensor]:
        """n_layer x [B, M', D]: the valid slots only (one host read: for checkpoints, not for the step)."""
        count = int(self.valid.sum())
        if count == 0:
            return []
        return [s[:, s.shape[1] - count :] for s in self.states]


class SegmentModel(Protocol):
    """What ``Recurrence`` steps (``MemoryTransformer``): its memory length, an empty memory, and a call on one
    segment whose output carries the new memory (``.mems``). Named here so that this module imports no model."""

    mem_len: int

    def empty_memory(self, batch: int, slots: int, device: torch.device) -> Memory: ...

    def __call__(self, tokens: Tensor, targets: Tensor | None = None, **kwargs: Any) -> Any: ...


class Recurrence:
    """The memory of one set of parallel streams from segment to segment. ``reset`` (a bool, or a bool tensor []
    read on the device) drops the memory first (an episode starts); the new memory is kept for the next segment."""

    def __init__(self) -> None:
        self.memory: Memory | None = None

    def clear(self) -> None:
        self.memory = None

    def step(
        self,
        model: SegmentModel,
        tokens: Tensor,
        targets: Tensor | None = None,
        *,
        reset: bool | Tensor = False,
        **kwargs,
    ) -> Any:
        """tokens, targets: [B, L]; kwargs: the rest of ``MemoryTransformer.forward`` (offset, loss_mask, ...);
        returns the model's output (a ``ModelOutput``)."""
        mem_len = kwargs.get("mem_len")
        mem_len = model.mem_len if mem_len is None else mem_len
        if mem_len == 0:
            self.memory = None
            return model(tokens, targets, **kwargs)
        B = tokens.shape[0]
        memory = self.memory
        if memory is None or (reset is True) or memory.slots != mem_len or memory.states[0].shape[0] != B:
            memory = model.empty_memory(B, mem_len, tokens.device)
        elif isinstance(reset, Tensor):
            memory = memory.reset(reset)
        out = model(tokens, targets, mems=memory, **kwargs)
        self.memory = out.mems
        return out
