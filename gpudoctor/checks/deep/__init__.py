"""Deep checks (level 3): sustained load, silent data corruption, GPU memory, host links."""
