set -u
S=/work/main/docs/perf/2026-11-30_cpu/alternating_processes.py
PY=/work/main/.venv/bin/python
for i in 1 2; do for v in old new; do
  if [ $v = old ]; then export PYTHONPATH=/tmp/old017; else export PYTHONPATH=/work/main; fi
  echo "== $v run $i: $(cd /tmp && $PY -c 'import posenc_lab; print(posenc_lab.__file__)') $(date -u +%H:%M:%S)"
  (cd /tmp && $PY $S xl,shaw,sinusoid 4)
done; done
