"""Settling a run: compose the config, resolve its hardware profile, plan the batch sizes within
the GPU's budget (the planner's request built from the config), and the config's own resolvers."""
