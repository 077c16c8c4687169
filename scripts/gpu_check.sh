#!/usr/bin/env bash
# The GPU check of docs/PERFORMANCE.md, prepared to run as it is on a machine with one CUDA GPU:
#
#   bash scripts/gpu_check.sh OUT_DIR        (default OUT_DIR: runs/gpu_check; ~10 minutes on one H100/H200)
#
# 1. the benchmark on base and the txl_* presets, bf16-mixed, memory on, fused vs unfused attention
#    (model.attention_impl), every step time also as a ratio to sinusoid's, the bf16 matmul peak measured
#    in the same run;
# 2. a 200-step training run per scheme (base, bf16-mixed, pystdlib bytes: local, no download), fused (auto);
# 3. OUT_DIR/PERFORMANCE_gpu.md: a dated section to paste into docs/PERFORMANCE.md.
# Every figure comes from this one command in one run. Until it runs, the fused path is checked on CPU by
# tests/test_fused.py (the same score_mods through flex_attention's reference implementation).
set -euo pipefail
OUT=${1:-runs/gpu_check}
PY=${PYTHON:-python}
SCHEMES=${SCHEMES:-xl,shaw,t5,alibi,sinusoid}
CONFIGS=${CONFIGS:-base,txl_enwik8_base,txl_wt103_base}
STEPS=${STEPS:-200}
# a dry run of the script itself on a CPU: DEVICE=cpu TRAINER=cpu PRECISION=32-true CONFIGS=tiny MODEL=tiny STEPS=4
DEVICE=${DEVICE:-cuda}
TRAINER=${TRAINER:-gpu}
PRECISION=${PRECISION:-bf16-mixed}
MODEL=${MODEL:-base}
ATTENTION=${ATTENTION:-fused,unfused}
BENCH_PRECISION=$([ "$PRECISION" = 32-true ] && echo fp32 || echo "$PRECISION")  # the bench's names
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  $PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU machine'"
fi
{ date -u '+%Y-%m-%d %H:%M UTC'; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    2>/dev/null || echo "no GPU ($DEVICE)"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/machine.txt"

$PY -m posenc_lab.bench --device "$DEVICE" --configs "$CONFIGS" --schemes "$SCHEMES" --precisions "$BENCH_PRECISION" \
    --memory on --attention "$ATTENTION" --ratio-to sinusoid --warmup 3 --reps 10 --out "$OUT/bench" \
    2>&1 | tee "$OUT/bench.log"

for s in $(echo "$SCHEMES" | tr , ' '); do
  $PY -m posenc_lab.train posenc="$s" model="$MODEL" data=pystdlib trainer="$TRAINER" trainer.max_steps="$STEPS" \
      trainer.precision="$PRECISION" \
      trainer.val_check_interval="$STEPS" trainer.limit_val_batches=10 trainer.enable_progress_bar=false trainer.log_every_n_steps=1 \
      final_eval.limit_batches=20 logger=csv checkpoint_every="$STEPS" run_dir="$OUT/train_$s" resume=null \
      2>&1 | tail -5 | tee "$OUT/train_$s.log"
done

$PY - "$OUT" "$SCHEMES" <<'EOF'
"""Write OUT/PERFORMANCE_gpu.md from this run's bench table and training logs."""
import csv, json, statistics, sys
from pathlib import Path

out, schemes = Path(sys.argv[1]), sys.argv[2].split(",")
machine = (out / "machine.txt").read_text().strip().splitlines()
lines = [f"## {machine[0]}: {machine[1]} ({machine[2]})", "",
         "`bash scripts/gpu_check.sh` (one command, one run): the benchmark (bf16-mixed, memory on, fused vs",
         "unfused attention, ratios to sinusoid, bf16 matmul peak measured in the run), then 200 training steps",
         "per scheme (pystdlib bytes, attention auto: fused on CUDA).", "",
         (out / "bench" / "bench.md").read_text().strip(), "", "| scheme | steps | median tokens/s (last 3/4 of the steps) |"
         " final train loss | val loss | test loss |", "|---|---:|---:|---:|---:|---:|"]
for s in schemes:
    run = out / f"train_{s}"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    tps = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
    tps = tps[len(tps) // 4:]  # past compilation and warm-up
    loss = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    res = json.loads((run / "results.json").read_text())
    lines.append(f"| {s} | {res['steps']} | {statistics.median(tps):,.0f} | {loss[-1]:.4f} | "
                 f"{res['val']['loss']:.4f} | {res['test']['loss']:.4f} |")
(out / "PERFORMANCE_gpu.md").write_text("\n".join(lines) + "\n")
print(f"wrote {out / 'PERFORMANCE_gpu.md'}")
EOF
