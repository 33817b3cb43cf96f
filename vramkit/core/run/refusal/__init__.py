"""How a run refuses a user's mistake: one message without a traceback (exit 2), standard error
held back while Hydra composes, and typos of command-line keys."""
