"""``posenc-lab ablate [experiment=NAME] [overrides]``: the main job.

Trains the grid of a preset (the schemes of ``ablate.schemes`` with and without memory, the loss variants and
the optional recall grid it asks for), each cell once per seed, then runs every analysis and writes the report:

    <ablate.out>/runs/<scheme>_mem<M>_<loss>_seed<S>/   one `posenc-lab train` run directory each
    <ablate.out>/report/report.md                        the report, its CSVs and PNGs (rewritten whole each time)
    <ablate.out>/grid.json                               the grid's state: every run, its overrides, status, and
                                                         wall and CPU seconds summed over its attempts, and the
                                                         folder's mark (its section "ablate")

``ablate.out`` is a new or empty folder, or one an earlier `posenc-lab ablate` made (marked in its grid.json, or
by an earlier version's ``.ablate.json``, which is moved into grid.json), which it continues; a folder of other
files, or another grid's (a `posenc-lab sweep`'s), is refused in one line before anything is loaded (``outdir.py``).

Config: conf/ablate.yaml (which composes conf/train.yaml) and a preset from conf/experiment/ (`ablation` by
default, `quick` as a smoke run of a few minutes, `zoo` for every registered scheme, `wt103_table6` for the
paper's setting on GPUs). ``ablate.jobs=N`` trains N runs at once, each its own process with ``ablate.threads``
torch threads. It resumes: a finished run with the same identity is reused, an interrupted one continues from
its last checkpoint. Ctrl-C or SIGTERM stops cleanly (exit 130 / 143) and prints the command that continues.

    posenc-lab ablate experiment=quick
    posenc-lab ablate experiment=ablation ablate.out=runs/my_ablation trainer.max_steps=800
    posenc-lab ablate --plan experiment=quick       # the run plan (--cfg: and the composed config)
    posenc-lab ablate --train-only                  # train the grid, no analysis or report

Layout: ``plan.py`` (the grid: cells -> runs, and what each run needs), ``jobs.py`` (the runs handed to the one
grid runner, ``posenc_lab.grid``, which starts and stops their processes and keeps grid.json; the progress
lines; what to say after a stop), ``outdir.py`` (the output folder: its files, whose it is, its lock, the report's
swap), ``main.py`` (the command: plan -> runner -> report). Planning and running know nothing of the analysis;
``main.py`` alone calls it, to read the finished run folders and write the report (``posenc_lab_analysis.report``),
as the layer above both (docs/ARCHITECTURE.md).
"""

from .main import main

__all__ = ["main"]
