"""Data: prompt sources, the standard-library corpus, records on disk and the build-data command."""
