"""The one naming rule for cells, owned by ``posenc_lab.cellnames`` (training names its wandb runs by it too):
its names, for the analysis' imports."""

from posenc_lab.cellnames import (
    ANY,
    GRAMMAR,
    WINDOW_KEY,
    CellName,
    CellPattern,
    HasCell,
    loss_label,
    scheme_label,
)

__all__ = ["ANY", "GRAMMAR", "WINDOW_KEY", "CellName", "CellPattern", "HasCell", "loss_label", "scheme_label"]
