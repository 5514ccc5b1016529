"""Who arrives last at each collective, from several ranks' traces of one window."""
