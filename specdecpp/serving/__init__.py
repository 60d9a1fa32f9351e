"""Serving heads: the vLLM proposer (`specdecpp.serving.vllm`)."""
