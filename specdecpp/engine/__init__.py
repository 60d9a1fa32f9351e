"""The decoding engine: the loop, the draft step and its backends (eager, compiled), the
schedules, the settings, logits processing and sampling."""
