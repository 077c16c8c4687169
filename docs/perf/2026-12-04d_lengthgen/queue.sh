#!/bin/bash
# one pilot at a time (normal priority, OMP_NUM_THREADS=1 set by pilot.py), in order
cd /work/wt/lg41 && . .venv/bin/activate
export PILOTS=/tmp/lg41_pilots OMP_NUM_THREADS=1
P=docs/perf/2026-12-04_lengthgen/pilot.py
COMMON="data=reverse model.mem_len=0 final_eval.enabled=false data.corpus.align_to_segment=32"
python $P M_rev_sin_nomem_al_4k posenc=sinusoid $COMMON
python $P N_rev_rope_nomem_al_4k posenc=rope $COMMON
python $P O_rev_sinrand_nomem_al_4k posenc=sinusoid +model.random_positions=256 $COMMON
python $P P_rev_roperand_nomem_al_4k posenc=rope +model.random_positions=256 $COMMON
