"""Reproducible speed measurements of vramkit; each module writes one JSON file under results/.

Run them all with ``make bench`` (``python -m benchmarks.run_all``), or one with
``python -m benchmarks.<name>``.
"""
