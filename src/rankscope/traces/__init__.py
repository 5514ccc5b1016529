"""Kineto traces, read by both sides: the summariser the job's finaliser runs and the
streaming reader the analysis uses. Imports neither numpy nor torch."""
