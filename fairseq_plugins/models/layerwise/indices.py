"""``--fusion-layers`` / ``--cross-attention-layers`` style layer lists."""
from typing import List, Optional


def parse_layer_indices(spec: Optional[str], flag: str) -> Optional[List[int]]:
    """``"0,2"`` -> [0, 2] (sorted, unique); None or "" -> None (all layers)."""
    if spec is None or spec == "":
        return None
    try:
        return sorted({int(tok) for tok in str(spec).split(",") if tok.strip() != ""})
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated layer indices, got {spec!r}") from None
