"""The analysis of posenc-lab: it reads run folders and writes reports (RECL, extrapolation, attention spans, eval
speed, the report, compare).

It uses posenc_lab's public functions and run directories; posenc_lab's core never imports it, only the layer on
top does (``posenc-lab ablate``'s command, the sweep table, the command line: docs/ARCHITECTURE.md).
"""

from posenc_lab import keep_freed_memory, prefer_passive_openmp

# Every module here is a script (python -m ...), and this runs before any of them imports torch. Importing the
# package (a notebook, a test) therefore applies both to that process too: the wait policy, and glibc's malloc
# keeping freed memory (more resident memory; POSENC_LAB_KEEP_FREED_MEMORY=0 before the import opts out).
prefer_passive_openmp()
keep_freed_memory()
