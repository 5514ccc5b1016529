"""Renderers that need more than a dict: the self-contained HTML report."""
