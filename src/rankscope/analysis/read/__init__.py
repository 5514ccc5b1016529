"""Readers: the run directory's files (through RunDir) and Kineto traces, into columns and events."""
