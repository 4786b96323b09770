"""Benchmark harness: ckptfs against the raw disk, direct uploaders and other S3 mounts, in one run.

Run it with `python -m bench` (or `make bench`). Every figure is a ratio against
its limit measured in the same run, repeated several times (median, min, max),
because the machines it runs on are shared and noisy. See docs/benchmarks.md.
"""
