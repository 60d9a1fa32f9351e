"""The decoding engine: the loop, its draft-step backends (eager, compiled), the schedules, the settings, logits processing and sampling."""
