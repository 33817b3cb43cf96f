"""The workload-neutral kit: running, configs, hardware, the memory planner, OOM recovery,
callbacks, IO, schedules and data loading. Nothing here imports a task."""
