"""The benchmark runs (tiny config, no timing asserted) and its FLOP count matches a hand count."""

from __future__ import annotations

import csv
import math

import pytest

from posenc_lab import bench
from posenc_lab.model import ModelConfig

SCHEMES = ("xl", "shaw", "sinusoid")


def test_flops_hand_count_xl_small():
    # small: 4 layers, D=128, F=512, V=256; L=128, M=128 -> N=256
    cfg = ModelConfig(n_layer=4, d_model=128, n_head=4, d_inner=512, mem_len=128, posenc="xl")
    L, N, D, F, V = 128, 256, 128, 512, 256
    per_layer = (
        2 * L * D * D  # q
        + 2 * N * D * (2 * D)  # k, v over memory + segment
        + 2 * L * N * D  # q k^T
        + 2 * L * N * D  # p v
        + 2 * L * D * D  # out
        + 2 * L * D * F + 2 * L * F * D  # feed-forward
        + 2 * N * D * D  # xl: W_{k,R} R (once per batch: batch_size=1 here)
        + 2 * L * N * D  # xl: (q + v) . r
    )
    assert per_layer == 92_274_688
    forward = 4 * per_layer + 2 * L * D * V
    assert bench.model_flops_per_token(cfg, 128, 128, training=False) == forward / L
    assert bench.model_flops_per_token(cfg, 128, 128) == 3 * forward / L
    assert bench.model_flops_per_token(cfg, 128, 128) == 3 * (4 * 92_274_688 + 8_388_608) / 128 == 8_847_360
    # batch 16: the position projection 2 N D D = 8,388,608 per layer is shared by the 16 streams
    assert bench.model_flops_per_token(cfg, 128, 128, batch_size=16) == 3 * (
        4 * (92_274_688 - 8_388_608 + 8_388_608 / 16) + 8_388_608) / 128


def test_flops_hand_count_other_schemes():
    D, F, V, L, M = 32, 64, 256, 16, 8
    N = L + M
    base = 2 * L * D * D + 2 * N * D * 2 * D + 2 * 2 * L * N * D + 2 * L * D * D + 4 * L * D * F
    head = 2 * L * D * V
    for name, extra in [
        ("sinusoid", 0),
        ("rope", 0),
        ("shaw", 2 * 2 * L * D * (2 * 3 + 1)),  # K = 3: q a^K^T and P a^V over 2K+1 rows
    ]:
        cfg = ModelConfig(n_layer=2, d_model=D, n_head=2, d_inner=F, posenc=name,
                          posenc_kwargs={"K": 3} if name == "shaw" else {})
        assert bench.model_flops_per_token(cfg, L, M, training=False) == (2 * (base + extra) + head) / L
    # no memory: N = L
    cfg = ModelConfig(n_layer=1, d_model=D, n_head=2, d_inner=F, posenc="nope")
    assert bench.model_flops_per_token(cfg, L, 0, training=False) == (
        2 * L * D * D + 2 * L * D * 2 * D + 4 * L * L * D + 2 * L * D * D + 4 * L * D * F + head) / L


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_tiny_runs_and_writes_table(tmp_path, capsys):
    assert bench.main(["--configs", "tiny", "--schemes", ",".join(SCHEMES), "--warmup", "1", "--reps", "2",
                       "--threads", "1", "--matmul-max-n", "256", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for column in ("train_tok_s", "eval_tok_s", "train_peak_mb", "train_mfu"):
        assert column in printed
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS
    assert {(r["scheme"], int(r["mem_len"])) for r in rows} == {(s, m) for s in SCHEMES for m in (16, 0)}
    for r in rows:
        for key in ("train_ms", "train_tok_s", "train_cpu_ms", "eval_cpu_ms", "eval_ms", "eval_tok_s", "train_gflop_per_step",
                    "matmul_peak_gflops", "train_mfu", "eval_mfu", "params",
                    "matmul_peak_cpu_gflops", "train_mfu_cpu", "eval_mfu_cpu"):  # CPU run
            assert _positive(float(r[key])), (key, r)
        for key in ("train_peak_mb", "eval_peak_mb"):  # RSS growth can be 0 when the heap is reused
            assert math.isfinite(float(r[key])) and float(r[key]) >= 0, (key, r)
    md = (tmp_path / "bench.md").read_text()
    assert "| config | scheme |" in md and md.count("| tiny |") == len(rows)


def test_bench_one_bf16_and_result_fields():
    r = bench.bench_one("tiny", "xl", memory=True, precision="bf16-mixed", warmup=1, reps=1, matmul_peak=1e9,
                        matmul_peak_cpu=1e9)
    assert r.precision == "bf16-mixed" and r.mem_len == 16
    assert _positive(r.train_tok_s) and _positive(r.eval_tok_s) and _positive(r.train_mfu)


def test_eval_speed_tiny():
    r = bench.measure_eval_speed("tiny", attention_len=32, segment_len=8, batch_size=2, warmup=0, reps=1)
    for key in ("memory_tok_s", "window_tok_s", "speedup"):
        assert _positive(r[key])
    assert r["attention_len"] == 32 and r["scheme"] == "xl"


def test_eval_speed_cli(tmp_path):
    assert bench.main(["--eval-speed", "--configs", "tiny", "--schemes", "sinusoid", "--attention-len", "24,32",
                       "--eval-segment-len", "8", "--eval-batch", "2", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "eval_speed.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["attention_len"]) for r in rows] == [24, 32] and all(float(r["speedup"]) > 0 for r in rows)


def test_unknown_names_are_rejected(capsys):
    assert bench.main(["--configs", "huge"]) == 2
    assert bench.main(["--schemes", "bogus"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_matmul_peak_positive():
    assert bench.matmul_peak_flops(max_n=256, reps=1) > 0
