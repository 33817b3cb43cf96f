"""Run folders: one per run, claimed and locked, owned by the run that wrote it, and found again
for a requeued job."""
