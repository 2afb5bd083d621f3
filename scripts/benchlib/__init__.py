"""Machinery for scripts/bench.py: a raw-socket load client and the processes it measures."""
