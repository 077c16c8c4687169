#!/usr/bin/env bash
# The GPU check (benchmarks/README.md), prepared to run as it is on a machine with one CUDA GPU:
#
#   bash scripts/gpu_check.sh OUT_DIR        (default OUT_DIR: runs/gpu_check; at most about 28 minutes on one H200, the
#                                             stage limits' sum: in groups of stages, STAGES below)
#
# Stages, most important first, each under its own time limit (LIMIT_*, seconds) so that a slow stage
# (torch.compile of flex_attention kernels dominates) leaves the later ones their turn; every stage logs
# to OUT_DIR as it goes, so a stage cut short still leaves the rows it measured:
# 1. correctness, fp32, loss and every gradient: tests/test_fused.py's CUDA test (the compiled fused kernels
#    against the unfused attention, for xl, shaw, t5 and alibi) and tests/test_compile.py's (every scheme's model
#    compiled by inductor against eager, the mission's five first);
# 2. the benchmark on base, bf16-mixed, memory on, fused vs unfused attention (model.attention_impl),
#    step times as ratios to sinusoid's, the bf16 matmul peak measured in the same run;
# 3. every scheme on base, bf16-mixed, memory on, attention auto, as ratios to sinusoid;
# 4. compiled against eager on base, bf16-mixed, torch.compile mode reduce-overhead (CUDA graphs): step times,
#    compile_s and the 1,000-step ratio (COMPILE_SCHEMES);
# 5. STEPS training steps per scheme (base, bf16-mixed, pystdlib bytes: local, no download), attention auto
#    (fused on CUDA);
# 6. the training step outside the model (`posenc-lab bench overhead`, xl at tiny and small on CUDA): Trainer.fit
#    against the bare forward, backward and optimizer loop, the overhead per step by interleaved rounds;
# 7. the benchmark on the published sizes (txl_enwik8_base, txl_wt103_base) at their published batch;
# 8. OUT_DIR/PERFORMANCE_gpu.md: a dated section to paste into benchmarks/results/LOG.md.
# One device command runs at most 10 minutes: run the stages in groups into the same OUT_DIR, each call under it,
#   STAGES=1,2 bash scripts/gpu_check.sh OUT; STAGES=3,4 bash ...; STAGES=5,6 ...; STAGES=7,8 ... (8 summarises all)
# A dry run of the script itself on a CPU (fused is NaN there: no flex backward on CPU):
#   DEVICE=cpu TRAINER=cpu PRECISION=32-true CONFIGS=tiny PAPER_CONFIGS= MODEL=tiny STEPS=4 BATCH=2 \
#     ALL_SCHEMES=sinusoid,xl,fire COMPILE_SCHEMES=sinusoid,xl \
#     TRAIN_SCHEMES=xl OVERHEAD_CONFIGS=tiny OVERHEAD_ROUNDS=1 OVERHEAD_STEPS=10 bash scripts/gpu_check.sh /tmp/gpu_dry
set -uo pipefail
OUT=${1:-runs/gpu_check}
PY=${PYTHON:-python}
SCHEMES=${SCHEMES:-sinusoid,xl,shaw,t5,alibi}
ALL_SCHEMES=${ALL_SCHEMES:-all}
COMPILE_SCHEMES=${COMPILE_SCHEMES:-sinusoid,xl,shaw}
TRAIN_SCHEMES=${TRAIN_SCHEMES:-xl,sinusoid,shaw}
CONFIGS=${CONFIGS:-base}
BATCH=${BATCH:-32}  # base: 32 streams x 256 tokens per step
PAPER_CONFIGS=${PAPER_CONFIGS-txl_enwik8_base:22,txl_wt103_base:60}  # preset:published batch; set empty: none
STEPS=${STEPS:-200}
DEVICE=${DEVICE:-cuda}
TRAINER=${TRAINER:-gpu}
PRECISION=${PRECISION:-bf16-mixed}
MODEL=${MODEL:-base}
ATTENTION=${ATTENTION:-fused,unfused}
LIMIT_TEST=${LIMIT_TEST:-300}
LIMIT_BENCH=${LIMIT_BENCH:-200}
LIMIT_ALL=${LIMIT_ALL:-200}
LIMIT_COMPILE=${LIMIT_COMPILE:-240}
LIMIT_TRAIN=${LIMIT_TRAIN:-120} # per scheme: xl reached step 173 of 200 in 60 s on an H200 (startup and compilation included)
LIMIT_PAPER=${LIMIT_PAPER:-120}
STAGES=${STAGES:-1,2,3,4,5,6,7,8}  # the stages to run: a device call's 10 minutes hold a few (see the header)
OVERHEAD_CONFIGS=${OVERHEAD_CONFIGS:-tiny,small}
OVERHEAD_ROUNDS=${OVERHEAD_ROUNDS:-3}
OVERHEAD_STEPS=${OVERHEAD_STEPS:-40}  # timed steps a round, a multiple of trainer.log_every_n_steps (10)
LIMIT_OVERHEAD=${LIMIT_OVERHEAD:-150}
BENCH_PRECISION=$([ "$PRECISION" = 32-true ] && echo fp32 || echo "$PRECISION") # the bench's names
for n in ${STAGES//,/ }; do
  case "$n" in [1-8]) ;; *) echo "gpu_check.sh: STAGES=$STAGES: '$n' is not a stage; valid: 1 to 8, e.g. 1,2" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "$DEVICE" = cuda ]; then
  $PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU machine'" || exit 1
fi
{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU ($DEVICE)"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"
# stage "N title" && { ... }: the stage runs, logged, if N is in STAGES (a comma-separated list)
stage() {
  case ",$STAGES," in *",${1%% *},"*) ;; *) return 1 ;; esac
  echo "== $(date -u +%T) $*" | tee -a "$OUT/stages.log"
}

stage "1 correctness (limit ${LIMIT_TEST}s)" && {
if [ "$DEVICE" = cuda ]; then
  timeout "$LIMIT_TEST" $PY -m pytest -q -p no:cacheprovider tests/test_fused.py tests/test_compile.py -k cuda -rA \
    2>&1 | tee "$OUT/test_cuda.log"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/stages.log"
fi
}

stage "2 benchmark $CONFIGS (limit ${LIMIT_BENCH}s)" && {
timeout "$LIMIT_BENCH" $PY -m posenc_lab.bench --device "$DEVICE" --configs "$CONFIGS" --batch "$BATCH" \
  --schemes "$SCHEMES" --precisions "$BENCH_PRECISION" --memory on --attention "$ATTENTION" --ratio-to sinusoid \
  --warmup 3 --reps 10 --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/stages.log"
}

stage "3 every scheme on $CONFIGS, attention auto (limit ${LIMIT_ALL}s)" && {
timeout "$LIMIT_ALL" $PY -m posenc_lab.bench --device "$DEVICE" --configs "$CONFIGS" --batch "$BATCH" \
  --schemes "$ALL_SCHEMES" --precisions "$BENCH_PRECISION" --memory on --ratio-to sinusoid \
  --warmup 3 --reps 10 --out "$OUT/bench_all" 2>&1 | tee "$OUT/bench_all.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/stages.log"
}

stage "4 compiled (mode reduce-overhead) against eager on $CONFIGS: $COMPILE_SCHEMES (limit ${LIMIT_COMPILE}s)" && {
timeout "$LIMIT_COMPILE" $PY -m posenc_lab.bench --device "$DEVICE" --configs "$CONFIGS" --batch "$BATCH" \
  --schemes "$COMPILE_SCHEMES" --precisions "$BENCH_PRECISION" --memory on --ratio-to sinusoid \
  --compile both --compile-mode reduce-overhead --warmup 3 --reps 10 --out "$OUT/bench_compile" \
  2>&1 | tee "$OUT/bench_compile.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/stages.log"
}

stage "5 training $STEPS steps: $TRAIN_SCHEMES (limit ${LIMIT_TRAIN}s each)" && {
for s in $(echo "$TRAIN_SCHEMES" | tr , ' '); do
  timeout "$LIMIT_TRAIN" $PY -m posenc_lab.train posenc="$s" model="$MODEL" data=pystdlib trainer="$TRAINER" \
    trainer.max_steps="$STEPS" trainer.precision="$PRECISION" trainer.val_check_interval="$STEPS" \
    trainer.limit_val_batches=10 trainer.enable_progress_bar=false trainer.log_every_n_steps=1 \
    final_eval.limit_batches=20 logger=csv checkpoint_every="$STEPS" run_dir="$OUT/train_$s" resume=null \
    >"$OUT/train_$s.log" 2>&1
  echo "train $s exit $?" | tee -a "$OUT/stages.log"
  tail -3 "$OUT/train_$s.log"
done
}

stage "6 overhead of the training step: $OVERHEAD_CONFIGS (limit ${LIMIT_OVERHEAD}s)" && {
timeout "$LIMIT_OVERHEAD" $PY -m posenc_lab.bench overhead --configs "$OVERHEAD_CONFIGS" --rounds "$OVERHEAD_ROUNDS" \
  --warmup 10 --steps "$OVERHEAD_STEPS" posenc=xl data=pystdlib trainer="$TRAINER" trainer.precision="$PRECISION" \
  2>&1 | tee "$OUT/overhead.log"
echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/stages.log"
}

stage "7 benchmark at the published sizes (limit ${LIMIT_PAPER}s)" && {
for cb in $(echo "$PAPER_CONFIGS" | tr , ' '); do
  timeout "$LIMIT_PAPER" $PY -m posenc_lab.bench --device "$DEVICE" --configs "${cb%%:*}" --batch "${cb##*:}" \
    --schemes sinusoid,xl --precisions "$BENCH_PRECISION" --memory on --attention "$ATTENTION" --ratio-to sinusoid \
    --warmup 3 --reps 5 --out "$OUT/bench_${cb%%:*}" 2>&1 | tee "$OUT/bench_${cb%%:*}.log"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/stages.log"
done
}

stage "8 summary" && {
$PY - "$OUT" "$TRAIN_SCHEMES" <<'EOF'
"""Write OUT/PERFORMANCE_gpu.md from what this run measured (stages cut short are named, not hidden)."""
import csv
import json
import statistics
import sys
from pathlib import Path

out, schemes = Path(sys.argv[1]), sys.argv[2].split(",")
machine = (out / "machine.txt").read_text().strip().splitlines()
lines = [f"## {machine[0]}: {', '.join(machine[1:])}", "", "`bash scripts/gpu_check.sh` (one command, one run).", ""]
for log in ["test_cuda.log"]:
    if (out / log).exists():
        text = (out / log).read_text().strip().splitlines()
        lines += ["Correctness on CUDA, fp32 (compiled fused attention against unfused; each scheme's compiled "
                  "model against eager): " + text[-1], "", "```"]
        lines += [t for t in text if t.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED"))] + ["```", ""]
if (out / "overhead.log").exists():  # its table comes last; a stage cut short shows the rounds it measured
    lines += ["### overhead of the training step (Trainer.fit against the bare loop)", "", "```",
              (out / "overhead.log").read_text().strip(), "```", ""]
for md in sorted(out.glob("bench*/bench.md")):
    lines += [f"### {md.parent.name}", "", md.read_text().strip(), ""]
for log in sorted(out.glob("bench*.log")):
    if not (out / log.stem / "bench.md").exists():
        lines += [f"### {log.stem}: cut short by its time limit; the rows it measured:", "", "```",
                  log.read_text().strip(), "```", ""]
lines += ["| scheme | steps | median tokens/s (last 3/4 of the steps) | final train loss | val loss | test loss |",
          "|---|---:|---:|---:|---:|---:|"]
for s in schemes:
    run = out / f"train_{s}"
    try:
        rows = list(csv.DictReader(open(run / "metrics.csv")))
        tps = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
        tps = tps[len(tps) // 4 :]  # past compilation and warm-up
        loss = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
        res = json.loads((run / "results.json").read_text())
        lines.append(f"| {s} | {res['steps']} | {statistics.median(tps):,.0f} | {loss[-1]:.4f} | "
                     f"{res['val']['loss']:.4f} | {res['test']['loss']:.4f} |")
    except (OSError, KeyError, ValueError, statistics.StatisticsError) as e:
        lines.append(f"| {s} | not finished: {type(e).__name__} {e} | | | | |")
(out / "PERFORMANCE_gpu.md").write_text("\n".join(lines) + "\n")
print((out / "PERFORMANCE_gpu.md").read_text())
EOF
}
true  # each stage logged its own exit status in stages.log
