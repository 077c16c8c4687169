"""Ordered segment streams: the Transformer-XL "ordered iterator" as a torch IterableDataset.

Layout. A corpus of N tokens is cut into `n_streams` (the global batch B) contiguous streams of
S = (N - 1) // B input positions each: stream b reads data[b*S : (b+1)*S] and predicts the next
tokens data[b*S + 1 : (b+1)*S + 1], so every token after the first is a target exactly once.
Every stream is cut into episodes [0, T), [T, 2T), ... (T = `episode_len`, the whole stream if
None), the same cut for all streams, and every episode into consecutive segments of at most L
tokens (shorter where the episode or the stream ends). Step t yields segment t of every stream.

A batch (one dict per step, already batched; use DataLoader(batch_size=None)):
    tokens    LongTensor [B, L]  inputs
    targets   LongTensor [B, L]  next tokens (tokens shifted by one)
    loss_mask BoolTensor [B, L]  where the loss counts (the `loss_mask` side array, else all True)
    offset    LongTensor [B]     position of tokens[:, 0] since its episode began
    reset     BoolTensor []      True on the first segment of an episode: drop memory before it
    distance  LongTensor [B, L]  the `distance` side array (recall probe), else -1
    position_ids {kind: LongTensor [B, L]}  the data's position ids of the inputs, only where it gives them
Side arrays are indexed like `data` and describe each token *as a target*: the batch takes
them at the target positions; the position ids describe each token as an input and are taken at the inputs.
"""

from __future__ import annotations

import itertools
import mmap
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .drawn import DrawnSplit

# Variable lengths are drawn per block of steps from an RNG seeded by (seed, block), so the
# length of step t depends only on (seed, t): resuming at any step replays the same lengths.
_BLOCK = 4096


@dataclass(frozen=True)
class _MemmapRef:
    """What pickling sends instead of a memmap's bytes: enough to map the same region again."""

    filename: str
    dtype: str
    shape: tuple
    offset: int

    def open(self) -> np.memmap:
        return np.memmap(self.filename, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)


def _to_ref(a):
    # Only a memmap that owns its mapping describes its own region; a slice of one would be
    # described wrongly by its inherited `offset`, so it is pickled by value instead.
    if isinstance(a, np.memmap) and isinstance(a.base, mmap.mmap) and a.filename:
        return _MemmapRef(a.filename, a.dtype.str, a.shape, a.offset)
    return a


def _from_ref(a):
    return a.open() if isinstance(a, _MemmapRef) else a


def segment_schedule(stream_len: int, lengths, episode_len: int | None = None, *, start_offset: int = 0, cycle=False):
    """The one rule that cuts a stream into segments, for training (``SegmentStream``) and for the analyses
    (``posenc_lab.context``). Yield (pos, length, offset, reset) per step: the step covers stream
    positions [pos, pos + length); offset = its first token's position since its episode began; reset =
    it starts an episode (memory is dropped before it). ``lengths``: the wanted segment length of every
    step (an int: always that); a segment never crosses an episode end or the stream end. The stream
    starts ``start_offset`` tokens into an episode; ``cycle``: wrap around at the end, forever (a new episode).
    """
    lengths = itertools.repeat(lengths) if isinstance(lengths, int) else lengths
    T = episode_len or stream_len + start_offset
    pos = 0
    for want in lengths:
        offset = (pos + start_offset) % T
        length = min(want, T - offset, stream_len - pos)
        yield pos, length, offset, offset == 0 or pos == 0
        pos += length
        if pos == stream_len:
            if not cycle:
                return
            pos, start_offset = 0, 0


def aligned_problem(align: int, segment: int, episode, var_len) -> str | None:
    """One line: why instances aligned to ``align`` tokens cannot start every segment of these streams; None if
    they can (``SegmentStream``'s rule, which the config check asks before anything is built)."""
    if (
        align == segment
        and not var_len
        and not (isinstance(episode, int) and not isinstance(episode, bool) and episode % align)
    ):
        return None
    return (
        f"data.corpus.align_to_segment={align} starts every instance at a multiple of {align} tokens: it needs "
        f"data.segment_len={segment} equal to it, data.var_len=false and data.episode_len null or a multiple of it "
        f"(it is {episode}); set data.corpus.align_to_segment={segment} (or 0: packed)"
    )


class SegmentStream(IterableDataset):
    """Yield the segments of `n_streams` parallel streams in order (see the module docstring).

    data:          1-D integer token array [N] (a memmap stays a memmap, also when pickled), or a ``DrawnSplit`` of
                   N positions a pass (drawn.py), whose every pass of a cycling stream reads new tokens
    segment_len:   L, tokens per segment (the mean with var_len)
    n_streams:     global batch B; with world_size > 1 this rank yields B / world_size of them
    loss_mask, distance: optional side arrays [N] (bool, int) sliced at the target positions
    position_ids:  optional {kind: [N] int}, each token's position ids as the data gives them (lengthgen's
                   abacus and coupling ids, ``model.data_positions``), sliced at the input positions
    episode_len:   T, tokens per episode (None: one episode per stream); must be >= segment_len
    cycle:         True: wrap around at the end of the streams forever (training, step-based;
                   the wrap starts a new episode); False: one pass (evaluation)
    var_len:       Transformer-XL variable lengths: L with prob. 0.95 else L/2, then
                   round(N(that, var_len_std)) clipped to [min_len, max_len] (defaults
                   min(5, L) and L, so no segment is longer than L; the paper allows L + 3 std)
    seed:          seeds the variable lengths; the same on every rank
    align:         > 0: the data's documents start at multiples of it (lengthgen's ``align_to_segment``): every
                   stream is cut at a multiple of it (S rounded down) and segment_len must equal it, so every
                   document begins a segment
    rank, world_size: this process's share of the streams (a disjoint contiguous block)
    start_batch:   skip the first batches: yields exactly what an uninterrupted run yields
                   from that step on. Under Lightning derive it from the global step (a
                   counter inside the dataset would see the loader's prefetching).

    With DataLoader workers, worker w of n yields steps w, w+n, ...; the loader's in-order
    round robin puts them back in order.
    """

    def __init__(
        self,
        data,
        segment_len: int,
        n_streams: int,
        *,
        loss_mask=None,
        distance=None,
        position_ids=None,
        episode_len: int | None = None,
        cycle: bool = False,
        var_len: bool = False,
        var_len_std: float = 5.0,
        min_len: int | None = None,
        max_len: int | None = None,
        seed: int = 0,
        align: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
    ):
        data = data if isinstance(data, (np.ndarray, DrawnSplit)) else np.asarray(data)
        if data.ndim != 1 or not np.issubdtype(data.dtype, np.integer):
            raise ValueError(f"data must be a 1-D integer token array, got shape {data.shape} dtype {data.dtype}")
        position_ids = dict(position_ids or {})
        named = [
            ("loss_mask", loss_mask),
            ("distance", distance),
            *((f"position_ids.{k}", a) for k, a in position_ids.items()),
        ]
        for name, side in named:
            if side is not None and len(side) != len(data):
                raise ValueError(
                    f"{name} has {len(side)} entries but data has {len(data)} tokens; "
                    f"side arrays must be aligned with the tokens"
                )
        if segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {segment_len}")
        if n_streams < 1:
            raise ValueError(f"n_streams must be >= 1, got {n_streams}")
        if episode_len is not None and episode_len < segment_len:
            raise ValueError(f"episode_len must be None or >= segment_len ({segment_len}), got {episode_len}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need world_size >= 1 and 0 <= rank < world_size, got rank {rank}, world_size {world_size}"
            )
        if n_streams % world_size:
            raise ValueError(
                f"n_streams (the global batch) {n_streams} is not divisible by world_size "
                f"{world_size}; use a multiple of {world_size}"
            )
        if align:
            if problem := aligned_problem(align, segment_len, episode_len, var_len):
                raise ValueError(problem)
        need = n_streams * segment_len + 1
        if len(data) < need:
            raise ValueError(
                f"too few tokens: {len(data)} tokens cannot make {n_streams} streams of at least "
                f"segment_len {segment_len} (need >= n_streams * segment_len + 1 = {need})"
            )
        min_len = min(5, segment_len) if min_len is None else min_len
        max_len = segment_len if max_len is None else max_len
        if var_len and not 1 <= min_len <= max_len:
            raise ValueError(f"variable lengths need 1 <= min_len <= max_len, got min_len {min_len}, max_len {max_len}")
        if var_len and var_len_std < 0:
            raise ValueError(f"var_len_std must be >= 0, got {var_len_std}")

        self.data, self.loss_mask, self.distance, self.position_ids = data, loss_mask, distance, position_ids
        self.segment_len, self.n_streams, self.episode_len = segment_len, n_streams, episode_len
        self.cycle, self.var_len, self.var_len_std = cycle, var_len, var_len_std
        self.min_len, self.max_len, self.seed = min_len, max_len, seed
        self.rank, self.world_size = rank, world_size
        self.align = align
        self.stream_len = (len(data) - 1) // n_streams  # S
        if align:  # every stream starts at a multiple of align: S = align floor(S / align)
            self.stream_len -= self.stream_len % align
        self.batch_size = n_streams // world_size  # streams of this rank
        first = rank * self.batch_size
        self._stream_starts = np.arange(first, first + self.batch_size, dtype=np.int64) * self.stream_len
        self._n_steps = None if cycle else sum(1 for _ in self.schedule())
        self.start_batch = self._checked_start(start_batch)

    # ---- schedule: which positions each step covers (the same for every stream and rank) ----

    @property
    def max_segment_len(self) -> int:
        """The longest segment this stream can yield."""
        return min(self.max_len if self.var_len else self.segment_len, self.stream_len)

    @property
    def max_position(self) -> int:
        """The largest position since episode start of any token yielded."""
        return min(self.episode_len or self.stream_len, self.stream_len) - 1

    def _drawn_lengths(self):
        """Segment length wanted at step 0, 1, 2, ... (before cutting at episode ends)."""
        if not self.var_len:
            yield from itertools.repeat(self.segment_len)
            return
        L = self.segment_len
        for block in itertools.count():
            rng = np.random.default_rng([self.seed, block])
            mean = np.where(rng.random(_BLOCK) < 0.95, L, L / 2)
            lengths = np.clip(np.rint(rng.normal(mean, self.var_len_std)), self.min_len, self.max_len)
            yield from lengths.astype(np.int64).tolist()

    def schedule(self):
        """Yield (pos, length, offset, reset) per step (``segment_schedule`` over this stream's lengths)."""
        return segment_schedule(self.stream_len, self._drawn_lengths(), self.episode_len, cycle=self.cycle)

    def _laps(self):
        """(lap, pos, length, offset, reset) per step: ``lap``, the passes over the streams before the step."""
        lap, first = 0, True
        for pos, length, offset, reset in self.schedule():
            lap += pos == 0 and not first  # every return to the streams' start, one-step passes too
            first = False
            yield lap, pos, length, offset, reset

    def __len__(self) -> int:
        """Batches one iteration yields (one pass minus start_batch); cycling streams have none."""
        if self._n_steps is None:
            raise TypeError("a cycling SegmentStream is infinite (training is step-based); it has no len()")
        return self._n_steps - self.start_batch

    # ---- iteration ----

    def __iter__(self):
        first, stride = self.start_batch, 1
        worker = get_worker_info()
        if worker is not None:
            first, stride = first + worker.id, worker.num_workers
        for lap, pos, length, offset, reset in itertools.islice(self._laps(), first, None, stride):
            yield self._batch(pos, length, offset, reset, lap)

    def _batch(self, pos: int, length: int, offset: int, reset: bool, lap: int = 0) -> dict:
        idx = self._stream_starts[:, None] + pos + np.arange(length + 1)  # [B, length + 1]
        if isinstance(self.data, DrawnSplit):  # a pass over drawn tokens reads its own: never a token read before
            idx = idx + lap * self.data.pass_stride
        window = torch.from_numpy(self.data[idx].astype(np.int64))
        target_idx = idx[:, 1:]
        B = self.batch_size
        if self.loss_mask is None:
            loss_mask = torch.ones(B, length, dtype=torch.bool)
        else:
            loss_mask = torch.from_numpy(np.asarray(self.loss_mask[target_idx], dtype=bool))
        if self.distance is None:
            distance = torch.full((B, length), -1, dtype=torch.long)
        else:
            distance = torch.from_numpy(self.distance[target_idx].astype(np.int64))
        batch = {
            "tokens": window[:, :-1].contiguous(),
            "targets": window[:, 1:].contiguous(),
            "loss_mask": loss_mask,
            "offset": torch.full((B,), offset, dtype=torch.long),
            "reset": torch.tensor(reset),
            "distance": distance,
        }
        if self.position_ids:
            inputs = idx[:, :-1]
            batch["position_ids"] = {
                k: torch.from_numpy(a[inputs].astype(np.int64)) for k, a in self.position_ids.items()
            }
        return batch

    # ---- resuming and pickling ----

    def _fingerprint(self) -> dict:
        # everything the schedule depends on; rank and world size are not: batch k is a global step
        fp = {
            "n_tokens": len(self.data),
            "n_streams": self.n_streams,
            "segment_len": self.segment_len,
            "episode_len": self.episode_len,
            "cycle": self.cycle,
            "var_len": self.var_len,
        }
        if self.var_len:
            fp.update(seed=self.seed, var_len_std=self.var_len_std, min_len=self.min_len, max_len=self.max_len)
        return fp

    def state_dict(self) -> dict:
        """{"batch": the step the next iteration starts at, plus the settings that give it meaning}."""
        return {"batch": self.start_batch, **self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Start the next iteration at state["batch"]; refuse a state from different settings."""
        mine = self._fingerprint()
        bad = {k: (state[k], v) for k, v in mine.items() if k in state and state[k] != v}
        if bad:
            raise ValueError(
                "stream state from different settings (saved, now): "
                + ", ".join(f"{k} {a!r} vs {b!r}" for k, (a, b) in bad.items())
            )
        self.start_batch = self._checked_start(int(state["batch"]))

    def _checked_start(self, batch: int) -> int:
        if batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {batch}")
        if self._n_steps is not None and batch > self._n_steps:
            raise ValueError(f"start_batch must be <= {self._n_steps} (the steps of this one-pass stream), got {batch}")
        return batch

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in ("data", "loss_mask", "distance"):
            state[k] = _to_ref(state[k])
        state["position_ids"] = {k: _to_ref(a) for k, a in state["position_ids"].items()}
        return state

    def __setstate__(self, state):
        for k in ("data", "loss_mask", "distance"):
            state[k] = _from_ref(state[k])
        state["position_ids"] = {k: _from_ref(a) for k, a in state.get("position_ids", {}).items()}
        self.__dict__.update(state)
