"""The run directory: its contract (every path, read and written through `_layout`),
the job side's safe writes, attempt identity and the meta files."""
