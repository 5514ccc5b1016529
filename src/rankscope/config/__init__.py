"""Configuration: the config dataclasses and their checks, their fields as data (flags,
docs), argparse helpers, the environment (read here alone) and rank detection."""
