"""Benchmark scripts (run them as scripts: ``python benchmarks/<name>.py``). A package only so that the scripts
share ``benchmarks.methods``' model builders, inputs and timers."""
