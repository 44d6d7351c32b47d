"""The benchmarks: one script per scenario over one small library (bench/lib/).

Run each from the repository's root as a module, `python -m bench.writer --quick`; `make
bench` runs a quick pass of every one. bench/RESULTS.md says what they found.
"""
