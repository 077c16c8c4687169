"""The one split vocabulary of posenc-lab: corpora, streams, logged metrics (``val/loss``), eval and analysis."""

SPLITS = ("train", "val", "test")
#: the splits that are evaluated (validation during training, test at the end; verdicts are judged on test)
EVAL_SPLITS = SPLITS[1:]


def check_split(split: str, valid: tuple[str, ...] = SPLITS) -> str:
    """``split`` if it is one of ``valid``, else ValueError naming the valid ones."""
    if split not in valid:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(valid)}")
    return split
