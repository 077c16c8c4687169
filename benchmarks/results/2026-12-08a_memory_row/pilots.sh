#!/bin/bash
# The Abacus reverse cell without memory: does nope with Abacus ids learn reverse when the whole instance is in one
# window (segment 24, no memory)? Beside the memory row's settings otherwise (batch 64, 8,000 steps, shift 24).
OUT=${OUT:-/tmp/pilots/abacus_reverse}
B="experiment=lengthgen_memory data=reverse data.corpus.seed=0 data.segment_len=24 model.mem_len=0"
B="$B posenc=nope model.data_positions=abacus"
python benchmarks/lengthgen_pilot.py --out $OUT --jobs 2 \
  reverse_nope_abacus_nomem_seed1="$B seed=1" reverse_nope_abacus_nomem_seed2="$B seed=2"
