"""The straggler analysis: the slow rank told from the ranks that wait for it, slow groups,
uneven data, what each costs and why (`_analyse.py` is its one entry)."""
