"""Benchmark suite for rmqdelay and its peer designs (see bench/README.md)."""
