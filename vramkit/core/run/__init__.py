"""What the entry points do: compose the config, build its objects, train or evaluate, log."""
