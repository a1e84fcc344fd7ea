"""`gpudoctor watch`: sampler -> analysis (pure) -> Textual app that only draws."""
