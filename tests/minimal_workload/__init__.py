"""The smallest workload vramkit can run: a linear regression on random points.

Its Python lives here (module.py, datamodule.py) and its conf files under conf/ (task, model,
data), found through Hydra's search path: ``hydra.searchpath=[file://<this folder>/conf]
task=minimal_regression``. docs/add_a_workload.md walks through it.
"""
