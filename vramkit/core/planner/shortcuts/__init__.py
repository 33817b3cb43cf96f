"""Speed shortcuts: fake outputs of common ops made without the fake dispatch.

Each is measured against the fake mode it replaces and checked equal to it by a test. Imports
nothing else of the planner.
"""
