"""Test support shipped with the library: synthetic timings, traces and run
directories with known answers, for the tests and the benchmarks. Never imported by a job."""
