"""Data plumbing every task shares: loader workers and the records of skipped input lines."""
