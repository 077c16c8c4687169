"""posenc-lab: positional-encoding schemes in segment-recurrent (Transformer-XL style) language models."""

import os

# On a shared or busy CPU, OpenMP worker threads that spin-wait while another process holds the core
# slow every small op down several-fold (measured here: 7.5 s vs 1.2 s per training step of the small
# model on 2 loaded cores); sleeping threads cost little otherwise. It only takes effect if set before
# torch is first imported, i.e. for the entry points (posenc-lab, python -m posenc_lab.*). Override
# with OMP_WAIT_POLICY=ACTIVE.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
