"""The decoding engine: the loop, the draft step and its eager and compiled backends, schedules, settings, sampling."""
