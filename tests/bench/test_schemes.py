"""The schemes a benchmark times with options (posenc_lab/bench/schemes.py, ``--schemes 'rope[scaling=dynamic]'``):
the entries parse as given, each point is named by the report's cell rule, bad options are one line naming the valid
ones before anything runs, and a point with options times the model those options build."""

from __future__ import annotations

import csv
import re

import pytest

from posenc_lab import bench
from posenc_lab.bench.configs import BenchConfig
from posenc_lab.bench.schemes import SchemeSpec, parse_schemes
from posenc_lab.positional import SCHEME_NAMES
from tests.bench.test_bench import TINY
from tests.schemes import HYBRID, NOPE, ROPE, SINUSOID, STICKBREAKING

LONG = ",".join(str(c + 1) for c in range(8))  # d_h / 2 = 8 factors at TINY's d_model 32 with 2 heads


def test_entries_parse_as_given_and_are_labelled_by_the_cell_rule():
    text = (
        f"{SINUSOID},{ROPE}[scaling=dynamic;original_len=128;factor=4],{SINUSOID}[softmax_scale=ssmax],"
        f"{HYBRID}[layers=[{ROPE},{ROPE},{ROPE},{NOPE}]],{ROPE}[scaling=longrope;short_factor=[{LONG}];softmax_scale=ssmax]"
    )
    plain, dynamic, ssmax, hybrid, longrope = parse_schemes(text, SCHEME_NAMES)
    assert plain == SchemeSpec(SINUSOID) and plain.label == SINUSOID and plain.text == SINUSOID
    assert dynamic.options == {"scaling": "dynamic", "original_len": 128, "factor": 4} and dynamic.model == {}
    assert dynamic.label == f"{ROPE}[scaling=dynamic;original_len=128;factor=4]"
    assert ssmax.options == {} and ssmax.model == {"softmax_scale": "ssmax"} and ssmax.label == f"{SINUSOID}+ssmax"
    assert hybrid.options == {"layers": [ROPE, ROPE, ROPE, NOPE]} and hybrid.label == "rope3+nope1"
    assert longrope.options["short_factor"] == list(range(1, 9))
    assert longrope.label == f"{ROPE}[scaling=longrope;short_factor=[1,2,...](8)]+ssmax"  # a long list shortened
    assert [s.scheme for s in parse_schemes("all", SCHEME_NAMES)] == list(SCHEME_NAMES)


@pytest.mark.parametrize(
    "entry, message",
    [
        (f"{ROPE}[scalng=dynamic]", rf"^--schemes {ROPE}\[scalng=dynamic\]: rope has no option 'scalng'; its options: "
         r"base, partial, scaling, .*, softmax_scale, attention_sink, output_gate$"),
        (f"{ROPE}[factor=big]", rf"^--schemes {ROPE}\[factor=big\]: rope: posenc\.factor must be a number, got 'big'$"),
        (f"{SINUSOID}[softmax_scale=ssmx]", r"model\.softmax_scale must be null \(the plain softmax\) or one of ssmax"),
        (f"{STICKBREAKING}[softmax_scale=ssmax]", r"softmax_scale=ssmax does not apply to posenc=stickbreaking: "),
        (f"{ROPE}[scaling=longrope]", rf"^--schemes {ROPE}\[scaling=longrope\] with --configs tiny: rope: "
         r"scaling=longrope needs posenc\.short_factor"),
        (f"{ROPE}[scaling=dynamic", r"^--schemes: 'rope\[scaling=dynamic' leaves a bracket open \(it needs '\]'\)$"),
        (f"{ROPE}[base]", r"^--schemes: 'rope\[base\]': expected key=value once per key, got 'base'$"),
        (f"{SINUSOID},{SINUSOID}[]", r"^--schemes names the point\(s\) \['sinusoid'\] more than once"),
    ],
)  # fmt: skip
def test_a_bad_entry_is_one_line_naming_it_before_anything_runs(capsys, entry, message):
    assert bench.main([*TINY, "--schemes", entry]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("posenc-lab bench: error: ") and captured.out == ""  # not even the environment line
    assert re.search(message, line.split(": error: ", 1)[1]), line


def test_a_point_with_options_times_the_model_they_build(tmp_path, capsys):
    """One round, one timed step: the ssmax point's model has its s_h (one per head and layer) beyond sinusoid's
    parameters, rope's dynamic point is named by its options, and --ratio-to names a point by its label."""
    schemes = f"{SINUSOID},{SINUSOID}[softmax_scale=ssmax],{ROPE}[scaling=dynamic;original_len=8;factor=4]"
    args = [*TINY, "--schemes", schemes, "--memory", "on", "--warmup", "0", "--reps", "1", "--threads", "1"]
    args += ["--matmul-max-n", "64", "--ratio-to", f"{SINUSOID}+ssmax", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    capsys.readouterr()
    with open(tmp_path / "bench.csv") as f:
        rows = {r["scheme"]: r for r in csv.DictReader(f)}
    dynamic = f"{ROPE}[scaling=dynamic;original_len=8;factor=4]"
    assert set(rows) == {SINUSOID, f"{SINUSOID}+ssmax", dynamic}
    n_layer, n_head = BenchConfig.preset("tiny").model["n_layer"], 2
    assert int(rows[f"{SINUSOID}+ssmax"]["params"]) == int(rows[SINUSOID]["params"]) + n_layer * n_head
    assert float(rows[f"{SINUSOID}+ssmax"]["train_ratio"]) == 1.0 != float(rows[SINUSOID]["train_ratio"])
    assert f"| {dynamic} |" in (tmp_path / "bench.md").read_text()


def test_options_go_over_the_yaml_and_are_sized_as_training_sizes_them():
    bc = BenchConfig.preset("tiny", 16, 2, d_model=32, n_head=2, mem_len=16)
    cfg = bc.model_config(ROPE, True, options={"scaling": "dynamic", "factor": 4})
    assert cfg.posenc_kwargs["scaling"] == "dynamic" and cfg.posenc_kwargs["factor"] == 4
    assert cfg.posenc_kwargs["base"] == 10000.0 and cfg.posenc_kwargs["original_len"] == 32  # the yaml's; M + L


def test_the_budgets_command_of_performance_md_names_budgets_py_points():
    """docs/PERFORMANCE.md's command for the 2025-26 schemes' budgets, run by bash up to the benchmark
    (``posenc-lab`` stands in to print its arguments): it parses, its schemes pass every check at ``base``, and
    its points are budgets.py's."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    from posenc_lab.bench import cli

    text = (Path(__file__).resolve().parents[2] / "docs" / "PERFORMANCE.md").read_text()
    block = next(b for b in text.split("```bash\n")[1:] if "LONG=$(" in b).split("```")[0]
    stand_in = f'python() {{ {shlex.quote(sys.executable)} "$@"; }}; posenc-lab() {{ printf "%s\\n" "$@"; }}\n'
    argv = subprocess.run(["bash", "-c", stand_in + block], capture_output=True, text=True, check=True).stdout
    argv = argv.splitlines()
    assert argv[0] == "bench"
    args = cli.build_parser().parse_args(argv[1:])
    assert (args.configs, args.precisions, args.memory, args.warmup, args.reps, args.rounds, args.ratio_to) == (
        "base", "fp32", "on", 2, 3, 2, SINUSOID
    )  # fmt: skip
    specs = parse_schemes(args.schemes, SCHEME_NAMES)
    assert cli.option_problems(args, ["base"], specs) == []
    bc = BenchConfig.preset("base")
    assert (bc.segment_len, bc.mem_len, bc.batch_size) == (256, 256, 8)
    labels = [s.label for s in specs]
    assert labels[:8] == [SINUSOID, "pope", "wall", "alibi", "alibi+ssmax", "sinusoid+ssmax", ROPE, "rope+ssmax"]
    dynamic, longrope = specs[8:]
    assert dynamic.options == {"scaling": "dynamic", "factor": 4.0, "original_len": 128}
    assert longrope.options["short_factor"] == [1.0] * 32
    assert longrope.options["long_factor"] == [float(40 ** (c / 31)) for c in range(32)]  # budgets.py's
