"""gpudoctor's version: one definition, importable from any layer without loading the API."""

__version__ = "0.1.0"
