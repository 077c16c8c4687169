#!/bin/bash
# The pilots of PILOTS.md, in the order they ran, one at a time (each next one chosen from the last: see PILOTS.md).
# Normal priority, OMP_NUM_THREADS=1 (set by pilot.py too); rows appended to $PILOTS/pilots.jsonl.
cd "$(git rev-parse --show-toplevel)" || exit 1
export PILOTS=${PILOTS:-/tmp/lengthgen_pilots_aligned} OMP_NUM_THREADS=1
P=docs/perf/2026-12-04_lengthgen/pilot.py
COMMON="data=reverse model.mem_len=0 final_eval.enabled=false data.corpus.align_to_segment=32"
RAND=+model.random_positions=256
python $P M_rev_sin_nomem_al_4k posenc=sinusoid $COMMON
python $P N_rev_rope_nomem_al_4k posenc=rope $COMMON
python $P O_rev_sinrand_nomem_al_4k posenc=sinusoid $RAND $COMMON
python $P P_rev_roperand_nomem_al_4k posenc=rope $RAND $COMMON
python $P Q_rev_sinrand_nomem_al_8k posenc=sinusoid $RAND trainer.max_steps=8000 $COMMON
python $P R_rev_roperand_nomem_al_8k posenc=rope $RAND trainer.max_steps=8000 $COMMON
python $P S_rev_sinrand_nomem_al_16k posenc=sinusoid $RAND trainer.max_steps=16000 $COMMON
python $P T_rev_roperand_nomem_al_16k posenc=rope $RAND trainer.max_steps=16000 $COMMON
