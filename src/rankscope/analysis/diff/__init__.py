"""What changed between two runs, or two trace windows: `rankscope diff`."""
