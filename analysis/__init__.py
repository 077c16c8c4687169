"""Analysis scripts of posenc-lab (RECL, extrapolation, attention spans, eval speed, report, ablate).

They use posenc_lab's public functions and run directories; posenc_lab never imports analysis.
Importing posenc_lab first sets OMP_WAIT_POLICY before torch loads (see posenc_lab/__init__.py).
"""

import posenc_lab  # noqa: F401
