#!/bin/bash
# The memory row's pilots (PILOTS.md): instances longer than a segment read through the memory. Two runs at a time,
# one thread each; rows appended to $OUT/pilots.jsonl. From the repository root.
OUT=${OUT:-/tmp/pilots/memory_row}
B="experiment=lengthgen data.segment_len=8 data.batch_size=64 data.corpus.align_to_segment=8 data.corpus.n_train=8"
B="$B data.corpus.max_factor=4 data.corpus.seed=0 model.mem_len=32 trainer.max_steps=8000 seed=1"
python benchmarks/lengthgen_pilot.py --out $OUT --jobs 2 \
  copy_xl="$B data=copy posenc=xl" copy_rope="$B data=copy posenc=rope" \
  copy_nope_abacus="$B data=copy data.corpus.position_ids=true data.corpus.position_shift=24 posenc=nope model.data_positions=abacus" \
  reverse_xl="$B data=reverse posenc=xl" reverse_rope="$B data=reverse posenc=rope"
