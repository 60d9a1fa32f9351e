"""Measuring: the cost model, timing the engine's steps, an evaluation's figures."""
