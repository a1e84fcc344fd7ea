"""Plumbing that keeps gpudoctor safe on a shared machine: file I/O, text, redaction, signals, process groups."""
