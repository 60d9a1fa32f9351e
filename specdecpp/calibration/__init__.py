"""Calibrating a head: the reliability report and choosing its stop threshold by replaying rounds."""
