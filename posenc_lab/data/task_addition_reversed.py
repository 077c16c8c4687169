"""Addition with every number written from its units (McLeish et al. 2024, "Transformers Can Do Arithmetic with the
Right Embeddings"; the reversed format Abacus embeddings need): ``addition``'s instances with both operands and the
sum reversed, ``7 4 + 8 5 = 5 0 1 .`` for 47 + 58 = 105. The sum is produced in the order it is computed, units
first, each digit from the operands' digits of its significance and the carry of the one before.

Abacus ids (``lengthgen.py``) count each number's digits from its first written one, the units here, so a digit's
id is its significance + 1 in both operands and the sum: ``1 2 0 1 2 0 1 2 3 0``. The coupled ids are
``addition``'s rule (``task_addition.py``)."""

from __future__ import annotations

from .task_addition import register_addition

make_addition_reversed = register_addition("addition_reversed", "McLeish et al. 2024", from_units=True)
