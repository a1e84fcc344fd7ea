"""Two runs compared: `check --baseline FILE` and `gpudoctor diff A B`."""
