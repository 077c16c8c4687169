#!/bin/bash
# The pilots of PILOTS.md, in the rounds they ran (each chosen from the last), two runs at a time, one thread each;
# rows appended to $OUT<round>/pilots.jsonl. From the repository root. Rounds 1-3 ran with the ids' table unscaled
# (commit acb81d8), rounds 4-5 with it scaled by sqrt(D) (the code of commit 7f9d0ee); round 5 (n_train 8) was stopped at
# about 3,000 steps and never read (PILOTS.md).
OUT=${OUT:-/tmp/pilots/a}
P="python benchmarks/lengthgen_pilot.py --jobs 2"
A="model.data_positions=abacus"
C="model.data_positions=coupling"
B="experiment=lengthgen data=addition_reversed data.corpus.n_symbols=10 data.corpus.seed=0 data.corpus.position_ids=true seed=1"
# round 1: operands to 8 digits, segments of 32, batch 16, ids shifted by up to 30
R1="$B data.segment_len=32 data.corpus.n_train=8 data.corpus.max_factor=4 data.corpus.position_shift=30 trainer.max_steps=6000"
$P --out ${OUT}1 nope="$R1 posenc=nope" abacus="$R1 posenc=nope $A" coupling="$R1 posenc=nope $C"
# round 2: operands to 4 digits, segments of 16, batch 64, shift 20
R2="$B data.segment_len=16 data.batch_size=64 data.corpus.n_train=4 data.corpus.max_factor=4 data.corpus.position_shift=20 trainer.max_steps=6000"
$P --out ${OUT}2 abacus="$R2 posenc=nope $A" coupling="$R2 posenc=nope $C"
# round 3: shift 12, 12,000 steps (stopped at about 5,000: flat at 0.6 and 0.78 train accuracy)
R3="${R2/position_shift=20/position_shift=12}"
$P --out ${OUT}3 abacus="${R3/max_steps=6000/max_steps=12000} posenc=nope $A" coupling="${R3/max_steps=6000/max_steps=12000} posenc=nope $C"
# round 4 (the table scaled): shift 12, 8,000 steps, the preset's settings
R4="${R3/max_steps=6000/max_steps=8000}"
$P --out ${OUT}4 abacus="$R4 posenc=nope $A" coupling="$R4 posenc=nope $C" nope="$R4 posenc=nope" \
   fire_abacus="$R4 posenc=fire $A" fire="$R4 posenc=fire" rope="$R4 posenc=rope"
# round 5: operands to 8 digits again, segments of 32, batch 32, shift 24 (stopped at about 3,000 steps)
R5="$B data.segment_len=32 data.batch_size=32 data.corpus.n_train=8 data.corpus.max_factor=4 data.corpus.position_shift=24 trainer.max_steps=8000"
$P --out ${OUT}5 abacus="$R5 posenc=nope $A" coupling="$R5 posenc=nope $C" nope="$R5 posenc=nope"
