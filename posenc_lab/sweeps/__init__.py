"""wandb sweep files: ``spec.py`` reads one, ``check.py`` checks every trial against ``conf/`` before any run,
``run.py`` runs one with wandb's own sweep engine and no server (``engine.py``, ``command.py``, ``trial.py``,
``state.py``, ``table.py``; imported only by that command).

posenc-lab sweep-check sweeps/ablation.yaml
python -m posenc_lab.sweeps sweeps/*.yaml
posenc-lab sweep sweeps/bayes_xl.yaml --count 30 --out runs/bayes-xl    # docs/SWEEPS.md
"""

from .check import check_sweep, logged_metrics, main, validate_config, validate_launcher
from .spec import Sweep, SweepError, format_override, load_sweep, multirun_overrides

__all__ = [
    "Sweep",
    "SweepError",
    "check_sweep",
    "format_override",
    "load_sweep",
    "logged_metrics",
    "main",
    "multirun_overrides",
    "validate_config",
    "validate_launcher",
]
