"""ICDAR 2015 evaluation (the DB protocol and the official RRC one), submission files and the run
report's detection figures."""
