"""Analysis scripts of posenc-lab (RECL, extrapolation, attention spans, eval speed, report, ablate).

They use posenc_lab's public functions and run directories; posenc_lab never imports analysis.
"""

from posenc_lab import keep_freed_memory, prefer_passive_openmp

# Every module here is a script (python -m ...), and this runs before any of them imports torch. Importing the
# package (a notebook, a test) therefore applies both to that process too: the wait policy, and glibc's malloc
# keeping freed memory (more resident memory; MALLOC_MMAP_MAX_=65536 before the import opts out).
prefer_passive_openmp()
keep_freed_memory()
