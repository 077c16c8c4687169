"""Per-call process CPU time of what lit.py cut (docs/PERFORMANCE.md, the training step outside the model), the best
of 5 x 200 calls. Run from the repository root with posenc-lab installed; the old finite watch is written out as it
stood."""

import io
import time
import timeit

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

from posenc_lab.lit import LitLM, LoggedStepBar, seed_step


def best(stmt, n=200, r=5):
    return min(timeit.Timer(stmt, timer=time.process_time).repeat(number=n, repeat=r)) / n * 1e6  # CPU us a call


cpu = torch.device("cpu")
print(f"torch.manual_seed          {best(lambda: torch.manual_seed(1234)):8.1f} us")
print(f"seed_step (cpu)            {best(lambda: seed_step(1234, cpu)):8.1f} us")
seq = best(lambda: int(np.random.SeedSequence([0, 5, 0, 0]).generate_state(1)[0]))
print(f"SeedSequence (_step_seed)  {seq:8.1f} us")

loss = torch.tensor(2.5)
first = [None]


def old_watch():
    now = torch.stack([torch.full_like(loss, 7), torch.full_like(loss, 3), loss]).float()
    if first[0] is None:
        first[0] = torch.full_like(now, float("inf"))
    fresh = ~torch.isfinite(loss) & torch.isinf(first[0][0])
    first[0] = torch.where(fresh, now, first[0])


print(f"old _watch_finite          {best(old_watch):8.1f} us")
lit = LitLM(model=dict(vocab_size=10, n_layer=1, d_model=16, n_head=2, d_inner=32, dropout=0.0))
print(f"new _watch_finite (amortised fold) {best(lambda: lit._watch_finite(loss, 3), n=256):8.1f} us")

module = L.LightningModule()
module.shown = {"train/loss": 2.5, "train/bpb": 3.6}
trainer = type("T", (), {"progress_bar_metrics": {}, "loggers": []})()


def bar_cost(cls):
    bar = cls()
    bar.train_progress_bar = Tqdm(file=io.StringIO(), dynamic_ncols=True, bar_format=TQDMProgressBar.BAR_FORMAT)
    i = [0]

    def one():
        i[0] += 1
        cls.on_train_batch_end(bar, trainer, module, None, None, i[0])

    return best(one)


class Before(LoggedStepBar):
    on_train_batch_end = TQDMProgressBar.on_train_batch_end


print(f"Lightning bar, per step    {bar_cost(TQDMProgressBar):8.1f} us")
print(f"before: LoggedStepBar      {bar_cost(Before):8.1f} us")
print(f"after:  LoggedStepBar      {bar_cost(LoggedStepBar):8.1f} us")
