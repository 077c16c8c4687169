"""LightningDataModule over ``posenc_lab.data``: ordered, resumable, DDP-sharded segment streams.

- train: an infinite, cycling stream (training is step-based); val/test: one ordered pass.
- ``batch_size`` is the *global* number of parallel streams. Under DDP, rank r of W takes the
  disjoint contiguous block of streams [r*B/W, (r+1)*B/W), so the global batch (and every
  stream's content) is the same whatever the number of devices. Lightning must not re-shard:
  the trainer configs set ``use_distributed_sampler: false``.
- On CUDA the loaders pin their batches (Lightning's copy to the device is then asynchronous) and, with
  ``num_workers: null``, make them in ``CUDA_WORKERS`` background processes; on the CPU no worker (it would take a
  core from the step). Workers keep the order: worker w of n makes steps w, w+n, ... and the loader takes them in
  turn (``SegmentStream``), so memory stays the true left context.
- The data position is the number of training batches consumed; it is saved in checkpoints
  (``state_dict``) and the train stream restarts there on resume (see ``train_dataloader``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from .data import Corpus, SegmentStream, load_corpus

CUDA_WORKERS = 2  # num_workers null on CUDA: one batch in the making while the other is copied


class SegmentDataModule(L.LightningDataModule):
    """Segment streams of one corpus.

    name: corpus name (``posenc_lab.data.CORPUS_NAMES``); corpus: its options (``load_corpus``).
    segment_len: L; batch_size: B, global number of streams; eval_batch_size: B for val/test
    (default: batch_size); episode_len: T, tokens per episode (None: whole stream); var_len:
    Transformer-XL variable training lengths; num_workers: loader processes (None: ``CUDA_WORKERS`` on CUDA, 0 on
    the CPU); root: cache directory (None: $POSENC_LAB_CACHE or ~/.cache/posenc_lab); seed: seeds the variable lengths.
    """

    def __init__(
        self,
        name: str,
        segment_len: int,
        batch_size: int,
        eval_batch_size: int | None = None,
        episode_len: int | None = None,
        var_len: bool = False,
        var_len_std: float = 5.0,
        num_workers: int | None = None,
        root: str | None = None,
        seed: int = 0,
        corpus: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.name, self.corpus_options, self.root = name, dict(corpus or {}), root
        self.segment_len, self.batch_size = segment_len, batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.episode_len, self.var_len, self.var_len_std = episode_len, var_len, var_len_std
        self.num_workers, self.seed = num_workers, seed
        self._corpus: Corpus | None = None
        self.streams: dict[str, SegmentStream] = {}
        self._resume_batch: int | None = None  # data position from a checkpoint

    # ---- the corpus -------------------------------------------------------------------------

    @property
    def corpus(self) -> Corpus:
        """The corpus, loaded (prepared and cached on first use) lazily."""
        if self._corpus is None:
            self._corpus = load_corpus(self.name, root=self.root, **self.corpus_options)
        return self._corpus

    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    @property
    def unit(self) -> str:
        """ "byte" | "char" | "word": decides bits per token vs perplexity."""
        return self.corpus.unit

    def prepare_data(self) -> None:  # local rank 0 first: download / build the cache
        _ = self.corpus

    # ---- streams ----------------------------------------------------------------------------

    def _rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def make_stream(self, split: str, rank: int = 0, world_size: int = 1) -> SegmentStream:
        """The stream of ``split`` ("train" | "val" | "test") for one rank."""
        common = dict(episode_len=self.episode_len, seed=self.seed, rank=rank, world_size=world_size)
        if split == "train":
            return self.corpus.stream(
                "train",
                self.segment_len,
                self.batch_size,
                cycle=True,
                var_len=self.var_len,
                var_len_std=self.var_len_std,
                **common,
            )
        return self.corpus.stream(split, self.segment_len, self.eval_batch_size, cycle=False, **common)

    def setup(self, stage: str | None = None) -> None:
        rank, world = self._rank()
        splits = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage, ("train", "val", "test"))
        for split in splits:
            self.streams[split] = self.make_stream(split, rank, world)

    def lengths(self, split: str) -> tuple[int, int]:
        """(longest segment, largest position since episode start) that ``split`` yields."""
        stream = self.streams[split] if split in self.streams else self.make_stream(split)
        return stream.max_segment_len, stream.max_position

    def _cuda(self) -> bool:
        return self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"

    def _loader(self, stream: SegmentStream) -> DataLoader:
        # batch_size=None: the stream yields whole batches; never shuffled, never re-sharded.
        cuda = self._cuda()
        workers = self.num_workers if self.num_workers is not None else CUDA_WORKERS if cuda else 0
        return DataLoader(stream, batch_size=None, num_workers=workers, persistent_workers=False, pin_memory=cuda)

    def train_dataloader(self) -> DataLoader:
        stream = self.streams["train"]
        if self._resume_batch is not None:
            stream.start_batch, self._resume_batch = self._resume_batch, None
        elif self.trainer is not None:  # batches consumed so far (0 for a fresh run)
            stream.start_batch = self.trainer.global_step * self.trainer.accumulate_grad_batches
        return self._loader(stream)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.streams["val"])

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.streams["test"])

    # ---- data position in checkpoints -------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The train stream's position (batches consumed) and the settings that give it meaning."""
        stream = self.streams.get("train")
        if stream is None or self.trainer is None:
            return {}
        state = stream.state_dict()
        state["batch"] = self.trainer.global_step * self.trainer.accumulate_grad_batches
        return {"train": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "train" not in state:
            return
        stream = self.streams["train"] if "train" in self.streams else self.make_stream("train")
        try:
            stream.load_state_dict(state["train"])  # refuses a position from other data settings
        except ValueError as e:
            raise ValueError(f"the checkpoint's data position does not fit this data config: {e}") from e
        self._resume_batch = int(state["train"]["batch"])
