"""Measuring: timing the engine's steps and an evaluation's figures."""
