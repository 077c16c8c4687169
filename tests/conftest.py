import torch

# Test tensors are tiny: extra intra-op threads only add contention (up to 100x slower per op on a
# loaded 2-core machine).
torch.set_num_threads(1)
