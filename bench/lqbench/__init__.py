"""Benchmark project: settings and the no-op, latency and sleep tasks measured by ``bench/run.py``."""
