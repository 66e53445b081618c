"""Benchmarks: prompt sets, acceptance/speed runs, tables and JSON."""
