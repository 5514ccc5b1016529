"""A pipeline's step replayed from the order its ranks ran their ops, which the straggler
analysis prices a slow stage by (`_replay.py` the model, `_replay_build.py` how a run becomes one)."""
