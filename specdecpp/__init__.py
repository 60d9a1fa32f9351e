"""specdecpp: SpecDec++ speculative decoding with a trained acceptance prediction head."""
from specdecpp.decoding import GenerationStats, SpeculativeOutput, speculative_generate
from specdecpp.head import AcceptancePredictionHead
from specdecpp.custom_generate import hf_generate

__all__ = ["speculative_generate", "SpeculativeOutput", "GenerationStats", "AcceptancePredictionHead", "hf_generate"]
__version__ = "0.1.0"
