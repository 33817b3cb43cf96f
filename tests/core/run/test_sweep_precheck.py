"""A sweep is checked before any job: its first job and each further value of each swept key."""

from __future__ import annotations

from vramkit.core.run.sweep_precheck import jobs_to_check


def test_each_listed_value_is_checked_once_in_the_command_lines_order():
    jobs = jobs_to_check(["+hw=cpu", "a=1,2,3", "b=range(0,10)", "c=interval(0,1)", "+d=x,y"])
    assert jobs == [
        ["+hw=cpu", "a=1", "b=0", "+d=x"],  # the first job
        ["+hw=cpu", "a=2", "b=0", "+d=x"],
        ["+hw=cpu", "a=3", "b=0", "+d=x"],
        ["+hw=cpu", "a=1", "b=9", "+d=x"],  # a range: its last value, not all ten
        ["+hw=cpu", "a=1", "b=0", "+d=y"],
    ]  # the interval is the sweeper's to draw: left out


def test_a_command_line_without_sweeps_is_one_job():
    overrides = ["+hw=t4", "model.optimizer.lr=0.1"]
    assert jobs_to_check(overrides) == [overrides]
