#!/bin/sh
# Every scheme, compile on and off, 2 rounds a config: round 1 on an empty inductor cache (cold), round 2 warm.
#   sh benchmarks/compile_every_scheme.sh OUT      (from the repository root, with posenc-lab installed)
# then: python benchmarks/compile_summary.py OUT
set -eu
out="${1:?usage: compile_every_scheme.sh OUT}"
mkdir -p "$out"
export TORCHINDUCTOR_CACHE_DIR="$out/inductor"
for c in tiny small base; do
  reps=5; [ $c = base ] && reps=3
  { date -u +%FT%TZ; uptime; } > "$out/$c.start"
  /usr/bin/time -v posenc-lab bench --configs $c --compile both --memory on --precisions fp32 \
    --schemes all --rounds 2 --warmup 2 --reps $reps --ratio-to sinusoid --out "$out/$c" > "$out/$c.log" 2>&1
  { date -u +%FT%TZ; uptime; } > "$out/$c.end"
done
