"""Analysis scripts of posenc-lab (RECL, extrapolation, attention spans, eval speed, report, ablate).

They use posenc_lab's public functions and run directories; posenc_lab never imports analysis.
"""

from posenc_lab import keep_freed_memory, prefer_passive_openmp

# Every module here is a script (python -m ...), and this runs before any of them imports torch.
prefer_passive_openmp()
keep_freed_memory()
