"""The benchmark runs (tiny preset, no timing asserted), its FLOP count matches a hand count, its sizes
are conf/model/'s, and the loss-curve experiment (analysis/loss_curve.py) runs."""

from __future__ import annotations

import csv
import math
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch

from posenc_lab import bench
from posenc_lab.bench import cli, probes
from posenc_lab.bench.configs import CONF_MODEL
from posenc_lab.compose import compose
from posenc_lab.model import MemoryTransformer, ModelConfig
from posenc_lab.positional import SCHEME_NAMES, sized_options
from tests.schemes import HYBRID, HYBRID_OF_TWO, NOPE, ROPE, SHAW, SINUSOID, XL

SCHEMES = (XL, SHAW, SINUSOID)
# the tiny preset shrunk further, so that a CPU test times it in seconds
TINY = ["--configs", "tiny", "--segment-len", "16", "--batch", "2", "--model-set", "d_model=32,n_head=2,mem_len=16"]


def test_flops_hand_count_xl_small():
    # small: 4 layers, D=128, F=512, V=256; L=128, M=128 -> N=256
    cfg = ModelConfig(n_layer=4, d_model=128, n_head=4, d_inner=512, mem_len=128, posenc=XL)
    L, N, D, F, V = 128, 256, 128, 512, 256
    per_layer = (
        2 * L * D * D  # q
        + 2 * N * D * (2 * D)  # k, v over memory + segment
        + 2 * L * N * D  # q k^T
        + 2 * L * N * D  # p v
        + 2 * L * D * D  # out
        + 2 * L * D * F
        + 2 * L * F * D  # feed-forward
        + 2 * N * D * D  # xl: W_{k,R} R (once per batch: batch_size=1 here)
        + 2 * L * N * D  # xl: (q + v) . r
    )
    assert per_layer == 92_274_688
    forward = 4 * per_layer + 2 * L * D * V
    assert bench.model_flops_per_token(cfg, 128, 128, training=False) == forward / L
    assert bench.model_flops_per_token(cfg, 128, 128) == 3 * forward / L
    assert bench.model_flops_per_token(cfg, 128, 128) == 3 * (4 * 92_274_688 + 8_388_608) / 128 == 8_847_360
    # batch 16: the position projection 2 N D D = 8,388,608 per layer is shared by the 16 streams
    assert (
        bench.model_flops_per_token(cfg, 128, 128, batch_size=16)
        == 3 * (4 * (92_274_688 - 8_388_608 + 8_388_608 / 16) + 8_388_608) / 128
    )
    # a built model counts the same as its config
    assert bench.model_flops_per_token(MemoryTransformer(cfg), 128, 128) == 8_847_360


def test_flops_hand_count_other_schemes():
    D, F, V, L, M = 32, 64, 256, 16, 8
    N = L + M
    base = 2 * L * D * D + 2 * N * D * 2 * D + 2 * 2 * L * N * D + 2 * L * D * D + 4 * L * D * F
    head = 2 * L * D * V
    for name, extra in [
        (SINUSOID, 0),
        (ROPE, 0),
        (SHAW, 2 * 2 * L * D * (2 * 3 + 1)),  # K = 3: q a^K^T and P a^V over 2K+1 rows
    ]:
        cfg = ModelConfig(
            n_layer=2, d_model=D, n_head=2, d_inner=F, posenc=name, posenc_kwargs={"K": 3} if name == SHAW else {}
        )
        assert bench.model_flops_per_token(cfg, L, M, training=False) == (2 * (base + extra) + head) / L
    # no memory: N = L
    cfg = ModelConfig(n_layer=1, d_model=D, n_head=2, d_inner=F, posenc=NOPE)
    assert (
        bench.model_flops_per_token(cfg, L, 0, training=False)
        == (2 * L * D * D + 2 * L * D * 2 * D + 4 * L * L * D + 2 * L * D * D + 4 * L * D * F + head) / L
    )


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_every_scheme_is_counted(name):
    """The count is the base model plus what the scheme itself declares: no scheme is special-cased in bench."""
    cfg = ModelConfig(
        n_layer=2,
        d_model=32,
        n_head=2,
        d_inner=64,
        posenc=name,
        posenc_kwargs=sized_options(name, HYBRID_OF_TWO if name == HYBRID else {}, 16, 8),
    )
    model = MemoryTransformer(cfg)
    nope = ModelConfig(n_layer=2, d_model=32, n_head=2, d_inner=64, posenc=NOPE)
    extra = model.scheme.extra_flops(16, 8, 4)
    assert extra >= 0
    assert bench.model_flops_per_token(model, 16, 8, training=False, batch_size=4) == pytest.approx(
        bench.model_flops_per_token(nope, 16, 8, training=False, batch_size=4) + 2 * extra / 16
    )


def test_sizes_come_from_conf_model():
    # every option of the group, the base it inherits aside; its sizes as `model=NAME` composes them
    assert set(bench.model_presets()) == {p.stem for p in CONF_MODEL.glob("*.yaml")} - {"default"}
    assert {"tiny", "small", "base"} <= set(bench.model_presets())
    for name in bench.model_presets():
        preset = compose("train", [f"model={name}", "run_dir=x"]).model
        bc = bench.BenchConfig.preset(name)
        cfg = bc.model_config(XL)
        assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.mem_len) == (
            preset["n_layer"],
            preset["d_model"],
            preset["n_head"],
            preset["mem_len"],
        )
        assert bc.batch_size == max(1, 2048 // bc.segment_len)  # the same tokens per step (as near as divides)
        assert bc.model_config(XL, memory=False).mem_len == 0
    with pytest.raises(ValueError, match="unknown model preset 'huge'; valid .*small"):
        bench.BenchConfig.preset("huge")


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_schemes_are_benchmarked_with_the_options_training_takes(name):
    """The benchmark reads conf/posenc/<name>.yaml as training composes it: the same options at the same lengths."""
    from posenc_lab.build import model_config
    from tests.helpers_train import compose_config

    cfg = compose_config("train", [f"posenc={name}", "model=tiny", "data.segment_len=24", "model.mem_len=40"])
    trained = model_config(cfg, 256).posenc_kwargs
    bc = bench.BenchConfig.preset("tiny", segment_len=24, mem_len=40)
    assert bc.model_config(name).posenc_kwargs == trained


def test_editing_a_yaml_changes_what_is_benchmarked(tmp_path, monkeypatch):
    from posenc_lab.bench import configs

    (tmp_path / f"{SHAW}.yaml").write_text(f"name: {SHAW}\nK: 3\n")
    monkeypatch.setattr(configs, "CONF_POSENC", tmp_path)
    model = MemoryTransformer(bench.BenchConfig.preset("tiny").model_config(SHAW))
    assert model.scheme.K == 3
    assert bench.BenchConfig.preset("tiny").model_config(NOPE).posenc_kwargs == {}  # no yaml: keyword defaults


def test_grid_axes_are_point_fields():
    points = bench.grid(config=["a", "b"], scheme=[XL], memory=[True, False])
    assert [(p.config, p.memory) for p in points] == [("a", True), ("a", False), ("b", True), ("b", False)]
    assert {f.name for f in fields(bench.Point)} - {"memory"} <= set(bench.COLUMNS)
    with pytest.raises(ValueError, match="unknown benchmark axis.*'fused'"):
        bench.grid(config=["a"], fused=[True])


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_tiny_runs_and_writes_table(tmp_path, capsys):
    assert (
        bench.main(
            [
                *TINY,
                "--schemes",
                ",".join(SCHEMES),
                "--warmup",
                "1",
                "--reps",
                "2",
                "--threads",
                "1",
                "--matmul-max-n",
                "256",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for column in ("train_tok_s", "eval_tok_s", "train_peak_mb", "train_mfu"):
        assert column in printed
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS
    assert {(r["scheme"], int(r["mem_len"])) for r in rows} == {(s, m) for s in SCHEMES for m in (16, 0)}
    assert {(int(r["segment_len"]), int(r["batch"])) for r in rows} == {(16, 2)}
    for r in rows:
        for key in (
            "train_ms",
            "train_tok_s",
            "train_cpu_ms",
            "eval_cpu_ms",
            "eval_ms",
            "eval_tok_s",
            "train_gflop_per_step",
            "matmul_peak_gflops",
            "train_mfu",
            "eval_mfu",
            "params",
            "matmul_peak_cpu_gflops",
            "train_mfu_cpu",
            "eval_mfu_cpu",
        ):  # CPU run
            assert _positive(float(r[key])), (key, r)
        for key in ("train_peak_mb", "eval_peak_mb"):  # RSS growth can be 0 when the heap is reused
            assert math.isfinite(float(r[key])) and float(r[key]) >= 0, (key, r)
    md = (tmp_path / "bench.md").read_text()
    assert "| config | scheme |" in md and md.count("| tiny |") == len(rows)


def test_rounds_combine_to_medians_and_ratio_ranges_per_point():
    def row(scheme, ms, ratio, eval_ms=50.0):
        return {
            "config": "base",
            "scheme": scheme,
            "precision": "fp32",
            "mem_len": 256,
            "compile": False,
            "attention": "auto",
            "device": "cpu x2",
            "batch": 8,
            "train_ms": ms,
            "train_ratio": ratio,
            "eval_ms": eval_ms,
        }

    nan = float("nan")
    rounds = [
        [row(XL, 130.0, 1.30, eval_ms=nan), row(SINUSOID, 100.0, 1.0, eval_ms=nan)],
        [row(SINUSOID, 90.0, 1.0, eval_ms=nan), row(XL, 99.0, 1.10)],  # the backward round: another order
        [row(XL, 120.0, 1.20, eval_ms=nan), row(SINUSOID, 100.0, 1.0, eval_ms=nan)],
        [row(XL, 125.0, nan, eval_ms=70.0), row(SINUSOID, 100.0, 1.0, eval_ms=nan)],
    ]
    combined = {r["scheme"]: r for r in bench.combine_rounds(rounds)}
    xl = combined[XL]
    assert xl["train_ms"] == 122.5 and xl["train_ratio"] == 1.20  # the NaN round is left out: median of 3
    assert (xl["train_ratio_min"], xl["train_ratio_max"]) == (1.10, 1.30)
    assert (combined[SINUSOID]["train_ratio_min"], combined[SINUSOID]["train_ratio_max"]) == (1.0, 1.0)
    assert xl["eval_ms"] == 60.0 and math.isnan(combined[SINUSOID]["eval_ms"])  # NaN in every round stays NaN
    assert xl["rounds"] == 4 and xl["device"] == "cpu x2" and xl["compile"] is False
    assert type(xl["batch"]) is int  # a count the rounds agree on stays a count
    keys = list(xl)
    assert keys[keys.index("train_ratio") + 1 : keys.index("train_ratio") + 3] == ["train_ratio_min", "train_ratio_max"]


def test_rounds_keep_points_apart_on_every_point_field():
    base = {"config": "tiny", "scheme": XL, "precision": "fp32", "mem_len": 16, "compile": False, "attention": "auto"}
    rows = [{**base, "train_ms": 1.0}, {**base, "attention": "unfused", "train_ms": 2.0}]
    assert [r["train_ms"] for r in bench.combine_rounds([rows, rows[::-1]])] == [1.0, 2.0]
    assert set(bench.POINT_KEYS) == {f.name for f in fields(bench.Point)} - {"memory"} | {"mem_len"}


def test_the_compile_cost_counts_the_first_step_once_in_a_1000_step_run():
    point = {"config": "tiny", "scheme": XL, "precision": "fp32", "mem_len": 16, "attention": "auto"}
    eager = {**point, "compile": False, "train_ms": 20.0, "train_first_ms": 30.0, "eval_ms": 8.0, "eval_first_ms": 9.0}
    compiled = {**point, "compile": True, "train_ms": 10.0, "train_first_ms": 5010.0}
    compiled |= {"eval_ms": 4.0, "eval_first_ms": 2004.0}
    other = {**point, "scheme": SINUSOID, "compile": True, "train_ms": 10.0, "train_first_ms": 10.0}  # no eager twin
    rows = {(r["scheme"], r["compile"]): r for r in cli.add_compile_cost([compiled, eager, other])}
    c = rows[(XL, True)]
    assert c["compile_s"] == pytest.approx(5.0) and c["eval_compile_s"] == pytest.approx(2.0)  # first over median
    # (5,010 + 999 x 10 + 2,000) / (30 + 999 x 20 + 1) ms: half the step time, but 7 s of compiling
    assert c["train_1000_ratio"] == pytest.approx(17_000 / 20_011)
    assert rows[(XL, False)]["train_1000_ratio"] == 1.0 and math.isnan(rows[(SINUSOID, True)]["train_1000_ratio"])


def test_compile_mode_reaches_torch_compile_and_a_bad_one_is_named(monkeypatch, capsys):
    """--compile-mode is torch.compile's mode for the compiled points only; an unknown one is refused with the valid
    ones, before any compute."""
    modes = []

    def fake_compile(model, mode=None, **kwargs):
        modes.append(mode)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    args = [*TINY, "--schemes", XL, "--memory", "on", "--warmup", "0", "--reps", "1", "--threads", "1"]
    args += ["--matmul-max-n", "128", "--compile", "both", "--compile-mode", "reduce-overhead"]
    assert bench.main(args) == 0 and modes == ["reduce-overhead"]
    modes.clear()
    assert bench.main([*args[:-1], "default"]) == 0 and modes == [None]
    with pytest.raises(SystemExit):
        bench.main([*args[:-1], "fast"])
    err = capsys.readouterr().err
    assert "invalid choice: 'fast'" in err and all(m in err for m in cli.COMPILE_MODES)


def test_the_first_warm_up_call_is_timed_apart(monkeypatch):
    import time

    calls = []

    def step():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.05)  # the call that compiles

    first: list[float] = []
    median = probes.median_time(step, torch.device("cpu"), warmup=2, reps=3, first=first)
    assert len(calls) == 5 and len(first) == 1 and first[0] >= 0.05 and median < 0.05


def test_bench_rounds_from_the_command_line(tmp_path, capsys):
    args = [*TINY, "--schemes", f"{XL},{SINUSOID}", "--memory", "on", "--warmup", "0", "--reps", "1"]
    args += ["--threads", "1", "--matmul-max-n", "128", "--ratio-to", SINUSOID, "--rounds", "2", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    printed = capsys.readouterr().out
    assert "round 1/2" in printed and "round 2/2" in printed
    # round 2 ran the schemes backwards
    progress = [line.split("scheme=")[1].split()[0] for line in printed.splitlines() if line.startswith("config=")]
    assert progress == [XL, SINUSOID, SINUSOID, XL]
    with open(tmp_path / "bench.csv") as f:
        rows = {r["scheme"]: r for r in csv.DictReader(f)}
    assert set(rows) == {XL, SINUSOID} and {r["rounds"] for r in rows.values()} == {"2"}
    assert {rows[SINUSOID][k] for k in ("train_ratio", "train_ratio_min", "train_ratio_max")} == {"1.0"}
    assert rows[XL]["batch"] == "2"  # a count, not a median
    low, high = float(rows[XL]["train_ratio_min"]), float(rows[XL]["train_ratio_max"])
    assert low <= float(rows[XL]["train_ratio"]) <= high
    each = []  # each round's own table, its ratio one of the two the median's range is made of
    for n in (1, 2):
        with open(tmp_path / f"bench_round{n}.csv") as f:
            each.append(float({r["scheme"]: r for r in csv.DictReader(f)}[XL]["train_ratio"]))
    assert sorted(each) == pytest.approx([low, high])
    assert bench.main([*TINY, "--rounds", "0"]) == 2 and "--rounds 0" in capsys.readouterr().err
    assert bench.main([*TINY, "--eval-speed", "--rounds", "2"]) == 2 and "--rounds 2" in capsys.readouterr().err


def test_bench_one_bf16_and_result_fields():
    bc = bench.BenchConfig.preset("tiny", segment_len=16, batch_size=2, d_model=32, n_head=2, mem_len=16)
    r = bench.bench_one(
        bc, XL, memory=True, precision="bf16-mixed", warmup=1, reps=1, matmul_peak=1e9, matmul_peak_cpu=1e9
    )
    assert r.precision == "bf16-mixed" and r.mem_len == 16 and r.scheme == XL
    assert _positive(r.train_tok_s) and _positive(r.eval_tok_s) and _positive(r.train_mfu)


def test_eval_speed_tiny():
    r = bench.measure_eval_speed("tiny", attention_len=32, segment_len=8, batch_size=2, warmup=0, reps=1)
    for key in ("memory_tok_s", "window_tok_s", "speedup"):
        assert _positive(r[key])
    assert r["attention_len"] == 32 and r["scheme"] == ModelConfig.posenc


def test_eval_speed_cli(tmp_path):
    assert (
        bench.main(
            [
                "--eval-speed",
                *TINY,
                "--schemes",
                SINUSOID,
                "--attention-len",
                "24,32",
                "--eval-segment-len",
                "8",
                "--eval-batch",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    with open(tmp_path / "eval_speed.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["attention_len"]) for r in rows] == [24, 32] and all(float(r["speedup"]) > 0 for r in rows)


def test_unknown_names_are_rejected(capsys):
    assert bench.main(["--configs", "huge"]) == 2
    assert bench.main(["--schemes", "bogus"]) == 2
    assert bench.main(["--model-set", "n_layerz=2"]) == 2
    err = capsys.readouterr().err
    assert "unknown ['huge']" in err and "'bogus'" in err and "'n_layerz'" in err and "small" in err


def test_matmul_peak_is_2n3_over_the_fastest_product_of_the_final_size(monkeypatch):
    """The size doubles while a product is quicker than min_seconds, up to max_n; the peak is 2 n^3 FLOP
    over the fastest of the timed products (torch.mm and F.linear, reps each)."""
    durations = iter([0.001, 0.001, 0.5, 0.25, 0.4, 0.3])  # n=256, n=512, then mm x2 and linear x2

    class Clock:  # advances by the next duration at every second call (start, end, start, end, ...)
        now, ended = 0.0, True

        def __call__(self):
            self.ended = not self.ended
            self.now += next(durations) if self.ended else 0.0
            return self.now

    monkeypatch.setattr(probes, "time", SimpleNamespace(perf_counter=Clock(), process_time=Clock()))
    assert bench.matmul_peak_flops(max_n=512, reps=2) == pytest.approx(2 * 512**3 / 0.25)


def test_loss_curve_experiment(tmp_path):
    from posenc_lab_analysis import loss_curve

    assert (
        loss_curve.main(
            [
                "--steps",
                "3",
                "--segment-len",
                "16",
                "--batch",
                "2",
                "--model-set",
                "d_model=32,n_head=2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    with open(tmp_path / "loss_curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["fp32/seed0", "bf16-mixed/seed0", "fp32/seed1"]
    assert float(rows[0]["gap_to_first"]) == 0 and all(math.isfinite(float(r["final_loss"])) for r in rows)
    with open(tmp_path / "loss_curve_steps.csv") as f:
        steps = list(csv.DictReader(f))
    assert [int(s["step"]) for s in steps] == [1, 2, 3]


@pytest.mark.parametrize("setting, flushed", [(None, True), ("keep", False)])
def test_entry_points_flush_denormals_unless_asked_to_keep_them(setting, flushed):
    """flush_denormals (called by train, eval and bench before torch starts its threads): a float below 1.2e-38
    becomes 0, unless POSENC_LAB_DENORMALS=keep. In a fresh process: the setting is process-wide."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "POSENC_LAB_DENORMALS"}
    if setting:
        env["POSENC_LAB_DENORMALS"] = setting
    code = (
        "import torch; from posenc_lab import flush_denormals; applied = flush_denormals(); "
        "print(applied, float(torch.tensor(1e-30) * torch.tensor(1e-10)) == 0.0)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(flushed), str(flushed)]
