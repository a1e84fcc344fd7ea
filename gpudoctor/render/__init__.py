"""Renderers read a Report (or a list of findings) and decide nothing."""
