import tempfile
from pathlib import Path
import torch
from posenc_lab.bench.overhead import overrides, time_bare
from posenc_lab.compose import compose
extra = ["posenc=xl", "model=small", "trainer.accelerator=cpu"]
with tempfile.TemporaryDirectory() as tmp:
    cfg = compose("train", overrides("small", 2, 3, str(Path(tmp) / "run"), extra))
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=True)
    time_bare(cfg, 2, 3, torch.device("cpu"), window=prof)
ev = prof.key_averages(group_by_input_shape=True)
rows = sorted([e for e in ev if e.key in ("aten::copy_", "aten::bernoulli_", "aten::cat", "aten::fill_", "aten::add")], key=lambda e: -e.self_cpu_time_total)
for e in rows[:14]:
    print(f"{e.key:18s} {e.self_cpu_time_total/1e3/3:7.2f} ms/step calls {e.count//3:4d} {str(e.input_shapes)[:110]}")
ev2 = prof.key_averages(group_by_stack_n=6)
rows = sorted([e for e in ev2 if e.key == "aten::copy_"], key=lambda e: -e.self_cpu_time_total)
for e in rows[:6]:
    print(f"--- copy_ {e.self_cpu_time_total/1e3/3:7.2f} ms/step calls {e.count//3}")
    print("   " + "\n   ".join(s for s in e.stack[:6]))
