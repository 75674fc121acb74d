"""Benchmark harnesses: engine, comm, train, model."""
