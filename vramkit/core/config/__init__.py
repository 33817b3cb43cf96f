"""Typed schemas of the config groups, and the checks that name key, file and closest valid key."""
