"""Host recurrence across runs and windows: which host keeps holding a slow rank."""
