import sys

from posenc_lab import flush_denormals, keep_freed_memory, prefer_passive_openmp

_APPLIES = "torch" not in sys.modules  # libgomp reads the policy once, when torch loads it
prefer_passive_openmp()
keep_freed_memory()

from . import main  # noqa: E402 - after the wait policy, before torch loads

flush_denormals()

sys.exit(main(omp_policy_applies=_APPLIES))
