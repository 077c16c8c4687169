import importlib.util
import os
import sys
from pathlib import Path

import pytest

import posenc_lab

# The wait policy of the command line (posenc_lab.prefer_passive_openmp, its one owner), set before torch loads
# libgomp, which reads it once (torch is imported by pytest_configure below, after this file, and by the test
# modules): OpenMP threads that spin-wait while another process holds the core slow every small op down
# several-fold on a loaded machine. The training subprocesses the tests start inherit it.
posenc_lab.prefer_passive_openmp()

# analysis/ installs as the package posenc_lab_analysis (setup.py). The tests import it by that name from
# this checkout, whatever is installed: a bare checkout has no such name, and an editable install may
# point at another checkout (a git worktree).
_ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"
_spec = importlib.util.spec_from_file_location(
    "posenc_lab_analysis", _ANALYSIS / "__init__.py", submodule_search_locations=[str(_ANALYSIS)]
)
sys.modules["posenc_lab_analysis"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["posenc_lab_analysis"])


# The default run's budget (CI: the whole of .ci/run in 20 minutes on 2 cores) leaves these end-to-end variants
# to `pytest -m slow`; each has a lighter sibling in the default run, named after the arrow.
SLOW = {
    "ablate/test_ablate.py::test_jobs_train_runs_concurrently_one_per_seed": "the tiny ablation fixture "
    "trains two at a time",
    "ablate/test_ablate.py::test_a_signal_stops_cleanly_and_says_how_to_continue[2-15]": "the [1-2] case",
    "ablate/test_ablate.py::test_damaged_files_of_a_finished_grid_are_named_and_odd_"
    "paths_work": "test_report's damaged files",
    "ablate/test_ablate.py::test_a_killed_run_is_continued_by_the_printed_command": "test_ablate's user's "
    "file (the command works once it is moved), test_run's stopped sweep (its printed command continues it)",
    "ablate/test_outdir.py::test_ablate_times_keeps_every_run_through_sigterm_and_a_kill_9_"
    "of_ablate": "test_ablate_outdir's stopped attempt (the ledger with a real process)",
    "ablate/test_outdir.py::test_the_report_is_rewritten_whole_and_keeps_its_dumps": "test_ablate_outdir's "
    "interrupted report (the swap itself)",
    "sweeps/test_run.py::test_hyperband_stops_a_planted_bad_trial": "the sweep runner's grid tests",
    "sweeps/test_run.py::test_a_grid_sweep_records_a_failing_trial_and_a_rerun_continues": "the runner's state tests",
    "sweeps/test_sweeps.py::test_two_job_multirun_and_report": "test_report's multirun folder, test_sweeps' "
    "composition",
    "sweeps/test_sweeps.py::test_sweep_trial_runs_end_to_end_with_wandb_offline": "test_report's wandb logging",
    "test_tracking.py::test_a_run_killed_and_extended_stays_one_wandb_run": "test_tracking's resume after SIGTERM",
    "analysis/test_report.py::test_damaged_analysis_files_recover_or_name_what_to_delete": "test_io's truncated files",
    "analysis/test_report.py::test_report_reads_a_multirun_folder": "test_sweeps' multirun composition",
    "test_rundir.py::test_a_refused_new_run_dir_leaves_nothing_behind": "test_one_line_errors' long tail",
    "test_one_line_errors.py::test_a_text_file_cut_short_while_a_run_trains_leaves_the_run_its_copy_and_a_resume_is_"
    "one_line": "test_data's copied text corpora",
    "test_one_line_errors.py::test_a_signal_during_the_sweeps_start_up_is_one_line_and_its_exit_status[INT]": "[TERM]",
    "positional/test_path.py::test_path_chunks_equal_the_product_per_pair[64-64-16]": "the six smaller layouts",
    "analysis/test_stats.py::test_the_interval_covers_at_its_nominal_rate[0.97-0.05-0.05]": "the [0.9-0.0-0.05] case",
    "analysis/test_stats.py::test_the_interval_covers_at_its_nominal_rate[0.99-0.05-0.05]": "the [0.9-0.0-0.05] case",
    "data/test_pystdlib.py::test_pystdlib_real_stdlib_capped": "test_families' real-stdlib split",
    "test_cli.py::test_console_train_bf16_mixed_with_clipping_in_a_fresh_run_dir": "test_precision's bf16 runs",
    "test_cli.py::test_console_eval": "test_cli's in-process evaluation tests",
    "test_cli.py::test_console_train": "test_ablate_is_a_posenc_lab_command (the console entry point)",
    "test_configs.py::test_every_option_trains_a_few_steps[data-pystdlib]": "experiment-ablation trains on it",
    "test_configs.py::test_every_option_trains_a_few_steps[model-txl_enwik8_base]": "model-tiny, model-small",
    "test_configs.py::test_every_option_trains_a_few_steps[model-txl_wt103_base]": "model-tiny, model-small",
    "test_configs.py::test_every_option_trains_a_few_steps[model-base]": "model-tiny, model-small",
    "test_configs.py::test_every_option_trains_a_few_steps[logger-wandb]": "test_report's wandb logging",
    "test_install.py::test_the_command_line_keeps_freed_memory_instead_of_faulting_it_in_again": "test_install's env",
    "test_ddp.py::test_ddp_ranks_take_disjoint_streams_and_match_one_process": "test_train's DDP stop",
    "test_lit.py::test_byte_corpus_logs_bits_per_token": "test_lit's figure names",
    "ablate/test_ablate.py::test_a_signal_stops_cleanly_and_says_how_to_continue[1-2]": "test_stop_signals "
    "(train's stops)",
    "analysis/sections/test_new_section.py::test_the_report_finds_it_and_writes_its_table_and_figure": "test_report's "
    "every section",
    "positional/test_new_scheme.py::test_ablate_grid_trains_it_and_the_report_orders_it": "test_new_scheme's "
    "registration test",
    "analysis/test_report.py::test_ablate_reuses_finished_runs_and_refuses_other_settings": "test_ablate's continue "
    "command",
    "test_configs.py::test_every_option_trains_a_few_steps[experiment-ablation]": "experiment-quick, experiment-tiny",
    "analysis/test_reach.py::test_the_tiny_reach_preset_reports_the_heatmap_and_the_reach_table": "test_report's tiny "
    "ablation (its reach section on the recall group)",
    "analysis/test_effective_context.py::test_the_tiny_context_preset_judges_the_recurrence_"
    "verdict_alone": "test_verdicts' verdict list and test_effective_context's tiny ablation",
    "analysis/test_recall.py::test_xl_with_memory_recalls_beyond_the_segment_and_without_memory_does_not": "the tiny "
    "ablation's "
    "recall group",
    "analysis/sections/test_lengthgen.py::test_the_tiny_preset_reports_every_cell_at_4x": "test_lengthgen_section's "
    "summary, "
    "verdict and grid tests, test_lengthgen's training run",
}
# every scheme trains a few steps in test_model (with and without memory): the posenc options of test_configs
# then only repeat it
SLOW_PREFIXES = {
    "test_configs.py::test_every_option_trains_a_few_steps[posenc-": "test_model's every scheme learns a pattern",
    "test_model.py::test_every_scheme_learns_a_repeated_pattern[0-": "the [16-*] cases, with memory",
}


def pytest_collection_modifyitems(config, items):
    matched, files = set(), set()
    for item in items:
        name = item.nodeid.split("tests/", 1)[-1]
        files.add(name.split("::", 1)[0])
        keys = {name, name.split("[", 1)[0]} & set(SLOW) | {p for p in SLOW_PREFIXES if name.startswith(p)}
        if keys:
            matched |= keys
            item.add_marker(pytest.mark.slow)
    stale = [k for k in [*SLOW, *SLOW_PREFIXES] if k.split("::", 1)[0] in files and k not in matched]
    whole_files = not config.option.keyword and not any("::" in a for a in config.args)
    if stale and whole_files:  # a renamed test would silently join the default run
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {stale}")


def pytest_configure(config):
    import torch

    # Test tensors are tiny: extra intra-op threads only add contention (up to 100x slower per op on a
    # loaded 2-core machine).
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _stop_wandb_service():
    """A test that starts wandb leaves its service running and its address in WANDB_SERVICE, which
    later tests' subprocesses would inherit and try to reach: stop it after every such test."""
    yield
    if "wandb" in sys.modules and os.environ.get("WANDB_SERVICE"):
        sys.modules["wandb"].teardown()
        os.environ.pop("WANDB_SERVICE", None)


# ---- shared fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One corpus cache for every test's tiny runs (the small corpora of tests/helpers_train.CORPUS)."""
    return tmp_path_factory.mktemp("corpus-cache")


@pytest.fixture(scope="session")
def finished(tmp_path_factory, cache):
    """A finished 4-step run (the recall probe, tiny model, checkpoints every 2 steps): its directory. Tests
    copy it before changing anything in it."""
    from posenc_lab.train import train  # torch and Lightning load when a test asks for a run, not at collection
    from tests.helpers_train import compose_config, tiny

    run = tmp_path_factory.mktemp("finished") / "run"
    train(compose_config("train", tiny(run, cache, "checkpoint_every=2", steps=4)))
    return run


@pytest.fixture(scope="session")
def tiny_ablation(tmp_path_factory):
    """`posenc-lab ablate experiment=tiny` (two at a time): the grid's run directories under runs/ and the report
    under report/. Tests copy what they change. Trained with --train-only, then reported by the command that line
    prints as the one that writes the report, run as printed (what a user of --train-only types next)."""
    import contextlib
    import io
    import re
    import shlex

    from posenc_lab import ablate

    out = tmp_path_factory.mktemp("ablate") / "tiny"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert ablate.main(["experiment=tiny", f"ablate.out={out}", "ablate.jobs=2", "--train-only"]) == 0
    command = shlex.split(re.search(r"--train-only: no report; `(.+)` writes it$", printed.getvalue(), re.M)[1])
    assert command[:2] == ["posenc-lab", "ablate"] and not (out / "report").exists()
    assert ablate.main(command[2:]) == 0 and (out / "report" / "report.md").is_file()
    return out
