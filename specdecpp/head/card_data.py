"""What the Hub shows for a head (library, tags, paper), read by both `head.model` and `head.folder`."""

LIBRARY_NAME = "specdecpp"
TAGS = ["speculative-decoding", "specdecpp", "acceptance-prediction-head"]
PAPER_URL = "https://arxiv.org/abs/2405.19715"
