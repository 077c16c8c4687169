#!/bin/bash
# Pilots of the Abacus reverse cell (README.md), every instance whole in one segment of 24 tokens: without memory,
# then with a memory of 32 (the previous instances' tokens, with the same ids, in it; no instance read across
# segments). The memory row's settings otherwise (batch 64, 8,000 steps, shift 24). Two runs at a time, one thread
# each; rows appended to $OUT/pilots.jsonl. From the repository root, with the venv's python on PATH.
OUT=${OUT:-/tmp/pilots/abacus_reverse}
B="experiment=lengthgen_memory data=reverse data.corpus.seed=0 data.segment_len=24"
B="$B posenc=nope model.data_positions=abacus"
python benchmarks/lengthgen_pilot.py --out $OUT --jobs 2 \
  reverse_nope_abacus_nomem_seed1="$B model.mem_len=0 seed=1" reverse_nope_abacus_nomem_seed2="$B model.mem_len=0 seed=2"
python benchmarks/lengthgen_pilot.py --out $OUT --jobs 2 \
  reverse_nope_abacus_seg24_mem32_seed1="$B model.mem_len=32 seed=1" \
  reverse_nope_abacus_seg24_mem32_seed2="$B model.mem_len=32 seed=2"
