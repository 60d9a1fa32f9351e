"""specdecpp: SpecDec++ speculative decoding with a trained acceptance prediction head."""
from __future__ import annotations

import importlib

# Loaded on first use (PEP 562): importing a submodule does not load the decoding engine.
_EXPORTS = {"speculative_generate": "specdecpp.custom_generate", "SpeculativeOutput": "specdecpp.engine.decoding",
            "GenerationStats": "specdecpp.engine.decoding", "AcceptancePredictionHead": "specdecpp.head.model",
            "hf_generate": "specdecpp.custom_generate"}

__all__ = ["speculative_generate", "SpeculativeOutput", "GenerationStats", "AcceptancePredictionHead", "hf_generate"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdecpp' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
