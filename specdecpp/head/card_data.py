"""What the Hub shows for a head: the library, tags and paper that the head class gives
`PyTorchModelHubMixin` and that `head.folder` puts in the card. Its own module, so that the head
and its folder both read it without importing each other."""

LIBRARY_NAME = "specdecpp"
TAGS = ["speculative-decoding", "specdecpp", "acceptance-prediction-head"]
PAPER_URL = "https://arxiv.org/abs/2405.19715"
