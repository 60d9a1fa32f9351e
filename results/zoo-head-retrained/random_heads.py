"""Random proposer heads for the zoo draft in other shapes (weights N(0, 0.05)), for timing judged steps only:
w64 (3 blocks 64 wide), L1 (one full-width block), L0 (no block: the output layer alone), nohidden (the three logit
features alone). From the repository root: `python results/zoo-head-retrained/random_heads.py /tmp/heads`."""
import sys

import torch

from specdecpp import AcceptancePredictionHead

torch.manual_seed(0)
SHAPES = {"w64": dict(hidden_size=256, num_layers=3, width=64), "L1": dict(hidden_size=256, num_layers=1),
          "L0": dict(hidden_size=256, num_layers=0), "nohidden": dict(hidden_size=0, num_layers=3)}
for name, shape in SHAPES.items():
    head = AcceptancePredictionHead(alignment="proposer", features=["log_q", "entropy", "margin"], **shape)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.normal_(0, 0.05)
    head.save_pretrained(f"{sys.argv[1]}/{name}")
