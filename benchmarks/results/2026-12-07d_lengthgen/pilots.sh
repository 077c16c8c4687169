#!/bin/bash
# The pilots of PILOTS.md, in the rounds they ran (each round chosen from the last), two runs at a time, one thread
# each; rows appended to $OUT/pilots.jsonl. From the repository root, at commit a8186d7 (the preset of before the
# attempt: 2 layers, segments of 32; every difference is an override below).
OUT=${OUT:-/tmp/pilots}
P="python benchmarks/lengthgen_pilot.py --out $OUT --jobs 2"
B="experiment=lengthgen data=reverse data.corpus.fresh=true data.corpus.align_to_segment=32 model.mem_len=0 final_eval.enabled=false"
R="+model.random_positions=256"
$P a_nope_4k="$B posenc=nope" b_sin_4k="$B posenc=sinusoid" c_rope_4k="$B posenc=rope" \
   d_roperand_8k="$B posenc=rope $R trainer.max_steps=8000" e_sinrand_8k="$B posenc=sinusoid $R trainer.max_steps=8000" \
   f_roperand_16k="$B posenc=rope $R trainer.max_steps=16000"
$P g_nope_L4_8k="$B posenc=nope model.n_layer=4 trainer.max_steps=8000" \
   h_roperand_L4_8k="$B posenc=rope $R model.n_layer=4 trainer.max_steps=8000" \
   i_sinrand_L4_8k="$B posenc=sinusoid $R model.n_layer=4 trainer.max_steps=8000" \
   j_nope_16k="$B posenc=nope trainer.max_steps=16000" \
   k_roperand_B32_8k="$B posenc=rope $R data.batch_size=32 trainer.max_steps=8000" \
   l_sin_L4_8k="$B posenc=sinusoid model.n_layer=4 trainer.max_steps=8000"
B="experiment=lengthgen data=reverse data.corpus.fresh=true data.segment_len=24 data.corpus.align_to_segment=24 model.mem_len=0 final_eval.enabled=false model.n_layer=4"
$P o_nope_L4_s24_12k="$B trainer.max_steps=12000 posenc=nope" p_roperand_L4_s24_12k="$B trainer.max_steps=12000 posenc=rope $R" \
   q_sin_L4_s24_12k="$B trainer.max_steps=12000 posenc=sinusoid" r_rope_L4_s24_12k="$B trainer.max_steps=12000 posenc=rope" \
   o1_nope_L4_s24_12k="$B trainer.max_steps=12000 posenc=nope seed=1" \
   p1_roperand_L4_s24_12k="$B trainer.max_steps=12000 posenc=rope $R seed=1"
$P s2_nope_L4_s24_10k="$B trainer.max_steps=10000 seed=2 posenc=nope" \
   t2_roperand_L4_s24_10k="$B trainer.max_steps=10000 seed=2 posenc=rope $R"
# The memory row's first pilot (PILOTS.md, last section), into another folder
B="experiment=lengthgen data=reverse data.segment_len=8 data.corpus.align_to_segment=8 model.mem_len=32 final_eval.enabled=false trainer.max_steps=8000"
python benchmarks/lengthgen_pilot.py --out ${OUT}_memory --jobs 2 m_xl_L8_M32_8k="$B posenc=xl" m_rope_L8_M32_8k="$B posenc=rope"
