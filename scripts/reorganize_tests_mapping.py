"""The mapping of scripts/reorganize_tests.py: which file each test goes to, by the module it tests."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Whole files: (old, new). Order matters where two files merge (the second merges into the first's target).
MOVES = [
    ("tests/test_ablate.py", "tests/analysis/ablate/test_ablate.py"),
    ("tests/test_ablate_outdir.py", "tests/analysis/ablate/test_outdir.py"),
    ("tests/test_analysis_settings.py", "tests/analysis/test_settings.py"),
    ("tests/test_cellnames.py", "tests/analysis/test_cellnames.py"),
    ("tests/test_compare.py", "tests/analysis/test_compare.py"),
    ("tests/test_coverage.py", "tests/analysis/test_coverage.py"),
    ("tests/test_effective_context.py", "tests/analysis/test_effective_context.py"),
    ("tests/test_power.py", "tests/analysis/test_power.py"),
    ("tests/test_reach.py", "tests/analysis/test_reach.py"),
    ("tests/test_recall.py", "tests/analysis/test_recall.py"),
    ("tests/test_recl.py", "tests/analysis/test_recl.py"),
    ("tests/test_report.py", "tests/analysis/test_report.py"),
    ("tests/test_stats.py", "tests/analysis/test_stats.py"),
    ("tests/test_variance.py", "tests/analysis/test_variance.py"),
    ("tests/test_verdicts.py", "tests/analysis/test_verdicts.py"),
    ("tests/test_new_section.py", "tests/analysis/sections/test_new_section.py"),
    ("tests/test_position.py", "tests/analysis/sections/test_position.py"),
    ("tests/test_table6.py", "tests/analysis/sections/test_table6.py"),
    ("tests/test_lengthgen_section.py", "tests/analysis/sections/test_lengthgen.py"),
    ("tests/test_lengthgen.py", "tests/data/test_lengthgen.py"),
    ("tests/test_bench.py", "tests/bench/test_bench.py"),
    ("tests/test_download.py", "tests/data/test_download.py"),
    ("tests/test_families.py", "tests/data/test_families.py"),
    ("tests/test_hf.py", "tests/data/test_hf.py"),
    ("tests/test_new_corpus.py", "tests/data/test_new_corpus.py"),
    ("tests/test_textdir.py", "tests/data/test_textdir.py"),
    ("tests/test_fused.py", "tests/positional/test_fused.py"),
    ("tests/test_new_scheme.py", "tests/positional/test_new_scheme.py"),
    ("tests/test_random_positions.py", "tests/positional/test_random_positions.py"),
    ("tests/test_rope_scaling.py", "tests/positional/test_rope.py"),
    ("tests/test_scheme_options.py", "tests/positional/test_registry.py"),
    ("tests/test_schemes.py", "tests/positional/test_schemes.py"),
    ("tests/test_sweep_run.py", "tests/sweeps/test_run.py"),
    ("tests/test_sweeps.py", "tests/sweeps/test_sweeps.py"),
    ("tests/test_checkpoint_integrity.py", "tests/test_checkpoints.py"),
    ("tests/test_eval_names.py", "tests/test_evaluate.py"),
    ("tests/test_eval_runs.py", "tests/test_evaluate.py"),
]

# Files that stay at the top of tests/ (a module of posenc_lab/, or a behaviour of the whole command: the configs,
# the install, the README's promises, the long tail of one-line errors, DDP, several nodes, SLURM).
KEEP = {
    "tests/test_cli.py",
    "tests/test_compile.py",
    "tests/test_configs.py",
    "tests/test_context.py",
    "tests/test_ddp.py",
    "tests/test_fidelity.py",
    "tests/test_grid.py",
    "tests/test_memory.py",
    "tests/test_module_size.py",
    "tests/test_no_host_sync.py",
    "tests/test_install.py",
    "tests/test_lit.py",
    "tests/test_model.py",
    "tests/test_multinode.py",
    "tests/test_one_line_errors.py",
    "tests/test_precision.py",
    "tests/test_readme.py",
    "tests/test_slurm.py",
    "tests/test_slurm_requeue.py",
    "tests/test_stop_signals.py",
    "tests/test_tables.py",
    "tests/test_tracking.py",
}

_FSP = "tests/positional/test_fox_stickbreaking_path.py"
_KSFCX = "tests/positional/test_kerple_sandwich_fire_cope_xpos.py"


@dataclass
class Split:
    helpers: str  # where what several files need goes
    tests: dict[str, str]  # test function or class -> target file
    primary: str  # what a bare reference to the old file now names
    helpers_doc: str = ""


SPLITS = {
    "tests/test_schemes_2025.py": Split(
        helpers="tests/positional/naive_fox_stickbreaking_path.py",
        helpers_doc="Naive per-pair references of the data-dependent schemes (fox, stickbreaking, path), written from\n"
        "docs/SCHEMES.md, and the check of a scheme against them, forward and backward.",
        primary=_FSP,
        tests={
            "test_each_equals_its_naive_reference_forward_and_backward": _FSP,
            "test_documented_options_exist": _FSP,
            "test_each_reads_no_position_and_refuses_random_positions": _FSP,
            "test_bad_options_raise_naming_the_value": _FSP,
            "test_without_the_layer_input_they_say_what_they_need": _FSP,
            "test_each_evaluates_past_its_training_memory": _FSP,
            "test_compare_reads_their_runs": _FSP,
            "test_fox_fused_path_equals_naive": "tests/positional/test_fox.py",
            "test_fox_compiled_cpu_forward_equals_naive": "tests/positional/test_fox.py",
            "test_fox_takes_the_fused_path_on_cuda_and_sdpa_on_cpu": "tests/positional/test_fox.py",
            "test_fox_gate_starts_as_the_authors": "tests/positional/test_fox.py",
            "test_fox_oldest_key_gate_is_never_used_and_a_closed_gate_cuts_the_past": "tests/positional/test_fox.py",
            "test_stickbreaking_nearest_key_breaks_first_and_the_rest_is_left": "tests/positional/"
            "test_stickbreaking.py",
            "test_path_chunks_equal_the_product_per_pair": "tests/positional/test_path.py",
            "test_path_chunks_carry_the_gradient_across_chunks": "tests/positional/test_path.py",
            "test_path_transforms_are_unit_with_beta_in_zero_two_and_start_at_one": "tests/positional/test_path.py",
            "test_path_options_change_the_transforms": "tests/positional/test_path.py",
            "test_path_short_conv_reaches_two_tokens_back_only": "tests/positional/test_path.py",
        },
    ),
    "tests/test_schemes_2026.py": Split(
        helpers="tests/positional/naive_kerple_sandwich_fire_cope_xpos.py",
        helpers_doc="Naive per-pair references of kerple_log, kerple_power, sandwich, fire, cope and xpos, in the\n"
        "papers' own formulations (FIRE's MLP per pair, CoPE's vector interpolation, xPos's per-channel decay), and\n"
        "the check of a scheme against them, forward and backward.",
        primary=_KSFCX,
        tests={
            "test_new_schemes_equal_naive_forward_and_backward": _KSFCX,
            "test_bias_schemes_fused_path_equals_naive": _KSFCX,
            "test_compiled_cpu_forward_equals_naive": _KSFCX,
            "test_bias_schemes_auto_rule_is_alibis_or_t5s": _KSFCX,
            "test_translation_invariance_holds_unless_declared": _KSFCX,
            "test_documented_options_exist": _KSFCX,
            "test_bad_options_raise_naming_the_value": _KSFCX,
            "test_kerple_and_sandwich_biases_start_at_zero_and_fall": _KSFCX,
            "test_every_new_scheme_trains_with_memory_and_episode_resets": _KSFCX,
            "test_each_new_scheme_trains_and_evaluates_past_its_training_memory": _KSFCX,
            "test_fire_below_its_threshold_is_a_function_of_the_distance": "tests/positional/test_fire.py",
            "test_fire_query_position_is_the_keys_it_sees": "tests/positional/test_fire.py",
            "test_fire_pieces_are_the_mlp_at_ties_too": "tests/positional/test_fire.py",
            "test_cope_counts_the_visible_gates_and_clamps_at_its_maximum": "tests/positional/test_cope.py",
            "test_cope_max_position_error_or_clamp": "tests/positional/test_cope.py",
            "test_kerple_constraints_are_projections": "tests/positional/test_kerple.py",
            "test_xpos_stays_finite_and_exact_far_from_the_start": "tests/positional/test_xpos.py",
            "test_xpos_decays_with_the_distance_and_is_rope_without_it": "tests/positional/test_xpos.py",
        },
    ),
    "tests/test_data.py": Split(
        helpers="tests/data/helpers_pystdlib.py",
        helpers_doc="The manifest of a prepared pystdlib corpus, and the modules of a fake standard library.",
        primary="tests/data/test_streams.py",
        tests={
            **dict.fromkeys(
                [
                    "test_batch_contract_shapes_and_dtypes",
                    "test_streams_are_contiguous_consecutive_and_cover_the_data",
                    "test_episodes_reset_offsets_and_segments_never_cross_them",
                    "test_one_episode_per_stream_counts_offsets_from_stream_start",
                    "test_cycling_stream_wraps_with_reset_and_has_no_len",
                    "test_variable_lengths_are_deterministic_bounded_and_vary",
                    "test_var_len_with_episodes_still_respects_episode_boundaries",
                    "test_resume_from_batch_k_equals_continuing",
                    "test_state_dict_round_trip_and_mismatch",
                    "test_ddp_shards_are_disjoint_and_concatenate_to_the_global_batch",
                    "test_bad_stream_settings_raise_clear_errors",
                    "test_non_integer_data_is_rejected",
                    "test_dataloader_workers_keep_the_order",
                    "test_memmap_stream_pickles_as_a_path_not_the_data",
                    "test_side_arrays_are_taken_at_target_positions",
                ],
                "tests/data/test_streams.py",
            ),
            "test_unknown_corpus_lists_the_valid_names": "tests/data/test_registry.py",
            **dict.fromkeys(
                [
                    "test_textfile_splits_by_position",
                    "test_textfile_too_small_for_the_split",
                    "test_textfile_is_read_from_a_copy_that_follows_the_file",
                    "test_textfile_same_size_text_with_its_mtime_kept_is_copied_again",
                    "test_textfile_missing_file_names_the_path",
                ],
                "tests/data/test_textfile.py",
            ),
            **dict.fromkeys(
                [
                    "test_pystdlib_split_is_by_family_disjoint_and_exact",
                    "test_pystdlib_cached_second_load_is_identical",
                    "test_pystdlib_real_stdlib_capped",
                ],
                "tests/data/test_pystdlib.py",
            ),
            "test_a_cache_file_with_other_content_is_refused_naming_it_and_the_folder_to_delete": "tests/data/"
            "test_cache.py",
            "test_a_cache_without_digests_is_prepared_again_to_the_same_tokens": "tests/data/test_cache.py",
            **dict.fromkeys(
                [
                    "test_recall_answers_the_planted_value_at_its_distance",
                    "test_recall_has_one_value_in_flight",
                    "test_recall_is_deterministic_and_validates",
                    "test_recall_corpus_streams_carry_mask_and_distance",
                    "test_recall_evaluation_range_is_its_own_and_its_far_items_were_never_trained",
                ],
                "tests/data/test_recall.py",
            ),
            "test_shared_context_matches_a_brute_force_search": "tests/data/test_overlap.py",
        },
    ),
    "tests/test_robustness.py": Split(
        helpers="tests/helpers_train.py",
        primary="tests/test_rundir.py",
        tests={
            "test_a_checkpoint_that_would_run_code_is_refused_before_it_runs": "tests/test_checkpoints.py",
            "test_after_a_divergence_the_named_checkpoint_resumes_and_trains_finitely": "tests/test_checkpoints.py",
            "test_bad_values_are_named_before_anything_is_written": "tests/test_checks.py",
            "test_learned_overflow_advice_is_an_option_eval_takes": "tests/test_evaluate.py",
            "test_eval_outputs_are_named_by_every_setting_and_rewritten_whole": "tests/test_evaluate.py",
            "test_cli_prints_the_full_trace_on_request": "tests/test_errors.py",
            "test_only_errors_raised_in_posenc_lab_count_as_deliberate": "tests/test_errors.py",
            "test_another_seed_or_model_in_a_finished_run_dir_is_refused_and_nothing_changes": "tests/test_rundir.py",
            "test_refused_command_line_run_prints_one_line_and_writes_nothing_not_even_hydra_files": "tests/"
            "test_rundir.py",
            "test_same_length_text_with_other_content_is_another_corpus": "tests/test_rundir.py",
            "test_a_folder_that_is_not_a_run_is_refused": "tests/test_rundir.py",
            "test_wall_time_accumulates_over_invocations": "tests/test_rundir.py",
            "test_multirun_with_a_fixed_run_dir_gives_every_job_its_own_run": "tests/test_rundir.py",
            "test_a_checkpoint_saved_by_another_process_while_starting_is_not_overwritten": "tests/test_rundir.py",
            "test_a_refused_new_run_dir_leaves_nothing_behind": "tests/test_rundir.py",
            "test_a_second_process_is_refused_and_a_stale_lock_is_taken_over": "tests/test_runlock.py",
            "test_truncated_files_are_recovered_or_named_with_what_to_delete": "tests/test_io.py",
        },
    ),
    "tests/test_reliability.py": Split(
        helpers="tests/helpers_train.py",
        primary="tests/test_checkpoints.py",
        tests={
            "test_good_checkpoints_keep_their_own_weights_when_tmpdir_is_another_file_system": "tests/"
            "test_checkpoints.py",
            "test_a_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file": "tests/test_checkpoints.py",
            "test_a_full_disk_leaves_the_previous_checkpoints_and_says_so_in_one_line": "tests/test_checkpoints.py",
            "test_kill_9_at_random_moments_of_saves_always_leaves_a_loadable_good_checkpoint": "tests/"
            "test_checkpoints.py",
            "test_a_full_disk_under_a_library_writer_is_one_line_too": "tests/test_io.py",
            "test_a_stop_signal_saves_at_the_end_of_the_step_and_the_run_resumes_exactly": "tests/test_train.py",
            "test_train_stopped_by_a_signal_prints_one_line_and_exits_non_zero": "tests/test_train.py",
            "test_a_signal_before_training_stops_at_once_and_leaves_no_new_run_dir": "tests/test_train.py",
            "test_sigterm_from_outside_saves_and_the_printed_command_continues_the_run": "tests/test_train.py",
            "test_sigterm_to_a_ddp_run_stops_every_rank_at_one_step_with_one_checkpoint_and_one_line": "tests/"
            "test_train.py",
            "test_sigterm_to_a_multirun_stops_the_sweep_and_names_the_job_to_continue": "tests/test_train.py",
        },
    ),
}

# The docstring of a file this script creates, or of the target of a whole move whose file now holds more
# (the old docstring follows it): what it tests.
DOCS = {
    _FSP: "The data-dependent schemes (fox, stickbreaking, path) against naive per-pair references written from\n"
    "docs/SCHEMES.md, forward and backward (q, k, v, the layer input and every parameter), with and without memory\n"
    "and the same-length mask; their options, and training and evaluation through the entry points.",
    "tests/positional/test_fox.py": "FoX (posenc_lab/positional/fox.py): the fused path against the naive reference,\n"
    "the path it takes, and what the paper leaves open (the gate's start, the unused oldest gate).",
    "tests/positional/test_stickbreaking.py": "Stick-breaking attention (posenc_lab/positional/stickbreaking.py): the\n"
    "nearest key breaks the stick first and the rest is left over.",
    "tests/positional/test_path.py": "PaTH (posenc_lab/positional/path.py): the chunked form equals the product per\n"
    "pair, gradients across chunks, and the transforms (unit w, beta in (0, 2), the short convolution's reach).",
    _KSFCX: "kerple_log, kerple_power, sandwich, fire, cope and xpos against naive per-pair references written from\n"
    "docs/SCHEMES.md, forward and backward, with and without memory; the invariants each declares; their options,\n"
    "and training and evaluation through the entry points.",
    "tests/positional/test_fire.py": "FIRE (posenc_lab/positional/fire.py): a function of the distance below its\n"
    "threshold, its query position, and its linear pieces against the MLP.",
    "tests/positional/test_cope.py": "CoPE (posenc_lab/positional/cope.py): the count of visible gates and its\n"
    "maximum.",
    "tests/positional/test_kerple.py": "KERPLE (posenc_lab/positional/kerple_log.py, kerple_power.py): the bounds of\n"
    "its parameters are projections.",
    "tests/positional/test_xpos.py": "xPos (posenc_lab/positional/xpos.py): finite and exact far from the start, and\n"
    "RoPE without its decay.",
    "tests/test_checkpoints.py": "Checkpoints (posenc_lab/checkpoints.py): read as data only, every save a new file\n"
    "renamed into place (a kill or a full disk leaves the previous ones), the newest two good ones kept.",
    "tests/test_evaluate.py": "Evaluation (posenc_lab/evaluate.py): outputs named by every setting, by run and\n"
    "checkpoint, never outside their folder, rewritten whole; the corpus compared with the run's.",
    "tests/data/test_streams.py": "Ordered segment streams (posenc_lab/data/streams.py): contiguous, consecutive,\n"
    "episodes and variable lengths, resume, DDP shards, workers, and clear errors.",
    "tests/data/test_registry.py": "The corpus registry (posenc_lab/data/registry.py): an unknown corpus lists the\n"
    "valid names.",
    "tests/data/test_textfile.py": "textfile, one text file as a corpus (posenc_lab/data/textfile.py): the split by\n"
    "position, read from a copy that follows the file, a missing file named.",
    "tests/data/test_pystdlib.py": "pystdlib, Python's standard library as a corpus (posenc_lab/data/pystdlib.py):\n"
    "the split by family, disjoint and exact, and its cache.",
    "tests/data/test_cache.py": "The corpus cache, checked by content (posenc_lab/data/cache.py).",
    "tests/data/test_recall.py": "The recall probe (posenc_lab/data/recall.py): the planted value at its distance,\n"
    "one value in flight, deterministic, and its evaluation range.",
    "tests/data/test_overlap.py": "Verbatim overlap between splits (posenc_lab/data/overlap.py) against a brute\n"
    "force search.",
    "tests/test_checks.py": "The one validator (posenc_lab/checks.py): every bad value is named before anything is\n"
    "written.",
    "tests/test_errors.py": "Errors raised on purpose (posenc_lab/errors.py): which count as deliberate, and the full\n"
    "trace on request.",
    "tests/test_rundir.py": "A run directory holds one run (posenc_lab/rundir.py): another run's settings are refused\n"
    "naming each difference, a folder of other files is refused, a refused run leaves nothing behind.",
    "tests/test_runlock.py": "``.lock`` (posenc_lab/runlock.py): a second process is refused, a stale lock taken over.",
    "tests/test_io.py": "Files written atomically and read with a named error (posenc_lab/io.py): damaged files are\n"
    "recovered or named with what to delete, a full disk is one line.",
    "tests/test_train.py": "Training's stop signals (posenc_lab/train.py): a signal saves at the end of the step,\n"
    "prints one line with the command that continues, and exits 143 / 130; DDP and multiruns stop as one.",
}

# Edits before the split, so that two files' helpers of one name are one helper (idempotent: skipped when the
# old text is gone). test_reliability's run_train is test_robustness' with data left at tiny()'s default.
PREP = [
    (
        "tests/test_reliability.py",
        "def run_train(run_dir, cache, *extra, steps=4):\n"
        '    return train(compose_config("train", tiny(run_dir, cache, *extra, steps=steps)))\n',
        'def run_train(run_dir, cache, *extra, steps=4, data="recall"):\n'
        '    return train(compose_config("train", tiny(run_dir, cache, *extra, steps=steps, data=data)))\n',
    ),
]

# Words in tests/conftest.py's reasons that name a file this script dissolves.
PHRASES = {
    "test_robustness' truncated files": "test_io's truncated files",
    "test_reliability's DDP stop": "test_train's DDP stop",
}

# Where test files are named (tests/test_x.py, tests/test_x.py::test_y).
REFERENCE_DIRS = ["tests", "docs", "conf", ".ci", "posenc_lab", "analysis", "scripts", "README.md"]
REFERENCE_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt", ""}
REFERENCE_SKIP = re.compile(r"(^|/)(perf/\d{4}-\d\d-\d\d[^/]*/)")  # recorded logs of past runs stay as recorded

TARGET = re.compile(r"\btests\.(?:\w+\.)*test_\w+\.([A-Za-z_]\w*)")
ISSUE_IN_DOCSTRING = re.compile(r" \((?:issues?|Issues?) \d+(?:, \d+)*(?:, item \d+)?\)")
