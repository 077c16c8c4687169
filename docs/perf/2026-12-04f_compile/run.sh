#!/bin/sh
# every scheme, compile on and off, 2 rounds a config: round 1 on an empty inductor cache (cold), round 2 warm
cd /work/main
. /work/venv/bin/activate
export TORCHINDUCTOR_CACHE_DIR=/work/cbench/inductor
for c in tiny small base; do
  reps=5; [ $c = base ] && reps=3
  { date -u +%FT%TZ; uptime; } > /work/cbench/$c.start
  /usr/bin/time -v posenc-lab bench --configs $c --compile both --memory on --precisions fp32 \
    --schemes all --rounds 2 --warmup 2 --reps $reps --ratio-to sinusoid --out /work/cbench/$c > /work/cbench/$c.log 2>&1
  { date -u +%FT%TZ; uptime; } > /work/cbench/$c.end
done
