"""What every analysis shares and nothing of an analysis: the options, the clock rules, the
chance test, the order of a rank's ops, worker processes, and how figures are written."""
