"""Learning-rate schedules and the optimizer plumbing every task module shares."""
