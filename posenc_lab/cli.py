"""The ``posenc-lab`` console script: ``posenc-lab <command> [args...]``.

Built-in commands: ``train`` and ``eval`` (Hydra apps: the arguments are Hydra overrides, ``--help``
shows the config groups, ``-m`` runs a sweep), ``bench`` (``posenc_lab.bench``), the grids ``ablate``
(``posenc_lab.ablate``: plan, train, report), ``sweep`` and ``sweep-check`` (``posenc_lab.sweeps``), and
``compare`` (``posenc_lab_analysis.compare``). This module sits on top of the import graph
(docs/ARCHITECTURE.md): it imports each command only when that command runs. Other packages add commands
through the entry-point group ``posenc_lab.commands``: a callable ``main(argv)`` registered as
``NAME = "module:main"``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from . import flush_denormals, keep_freed_memory, prefer_passive_openmp

ENTRY_POINT_GROUP = "posenc_lab.commands"

# name -> (module run with `python -m` / imported, one-line help)
BUILTIN = {
    "train": ("posenc_lab.train", "train a model: posenc-lab train posenc=xl data=recall trainer.max_steps=200"),
    "eval": (
        "posenc_lab.evaluate",
        "evaluate a checkpoint: posenc-lab eval ckpt=PATH data.segment_len=256 model.mem_len=512",
    ),
    "bench": ("posenc_lab.bench", "measure speed and memory of the schemes"),
}


def _ablate() -> Callable:
    from .ablate import main

    return main


def _sweep() -> Callable:
    from .sweeps.run import main

    return main


def _sweep_check() -> Callable:
    from .sweeps import main

    return main


def _compare() -> Callable:
    from posenc_lab_analysis.compare import main

    return main


# name -> (what returns its main(argv), importing the command only when it runs; one-line help)
COMMANDS: dict[str, tuple[Callable[[], Callable], str]] = {
    "ablate": (_ablate, "plan, train and report a preset's grid: posenc-lab ablate experiment=quick"),
    "sweep": (_sweep, "run a wandb sweep file without a server: posenc-lab sweep sweeps/bayes_xl.yaml --count 30"),
    "sweep-check": (_sweep_check, "check every trial of sweep files against conf/: posenc-lab sweep-check FILE"),
    "compare": (_compare, "a variant against its baseline on the same tokens: posenc-lab compare RUN_A RUN_B"),
}


def plugin_commands() -> dict[str, object]:
    """Entry points of the group ``posenc_lab.commands`` by name (not loaded)."""
    own = {*BUILTIN, *COMMANDS}
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in own}


def usage() -> str:
    plugins = plugin_commands()
    width = max(map(len, [*BUILTIN, *COMMANDS, *plugins]))
    lines = ["usage: posenc-lab <command> [args...]", "", "commands:"]
    for name, (_, text) in [*BUILTIN.items(), *COMMANDS.items()]:
        lines.append(f"  {name:<{width}}  {text}")
    for name, ep in sorted(plugins.items()):
        lines.append(f"  {name:<{width}}  (plugin: {ep.value})")
    lines += [
        "",
        "`posenc-lab <command> --help` shows a command's own options. train and eval take Hydra",
        "overrides (key=value, group=option, -m for sweeps); see docs/USAGE.md.",
    ]
    return "\n".join(lines)


def _run_hydra_app(module: str, argv: Sequence[str]) -> int:
    """Run a Hydra app as ``python -m module argv...``. Hydra reads sys.argv; and Lightning's DDP
    launcher re-runs the command line of the main process for every other rank, so the process
    must *be* ``python -m posenc_lab.train ...``, not ``posenc-lab train ...``: replace it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
    return 0  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    prefer_passive_openmp()  # before any command imports torch; train/eval inherit it through exec
    keep_freed_memory()  # bench and plugins in this process, train/eval through the environment
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command in ("train", "eval"):
        return _run_hydra_app(BUILTIN[command][0], rest)
    if command == "bench":
        flush_denormals()  # before torch starts its threads (train and eval: their __main__)
        try:
            bench = importlib.import_module("posenc_lab.bench")
        except ModuleNotFoundError as e:
            if e.name != "posenc_lab.bench":
                raise
            print("posenc-lab bench: posenc_lab.bench is not available in this installation", file=sys.stderr)
            return 2
        return int(bench.main(rest) or 0)
    if command in COMMANDS:
        return int(COMMANDS[command][0]()(rest) or 0)
    plugins = plugin_commands()
    if command in plugins:
        func: Callable = plugins[command].load()
        return int(func(rest) or 0)
    print(f"posenc-lab: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
