"""``method="auto"``: pick an engine from the table's shape, batch and device."""

from __future__ import annotations

import torch

from ._table import ConstructionTable


def choose_method(table: ConstructionTable, batch_shape: torch.Size, device: torch.device) -> str:
    """Engine for one call; a pure function of static information."""
    return "levels"
