"""The Textual dashboard: the only code that imports textual."""
