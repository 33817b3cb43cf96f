"""Decisions: plans from traces, the largest batch that fits, remedies when nothing fits, reports.

The top layer: it reads traces (`tracing`) and never the other way round.
"""
