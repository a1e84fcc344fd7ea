"""One module per area; each registers its checks with `gpudoctor.registry.check`.

The list of modules, in display order, is `gpudoctor.registry.CHECK_MODULES`.
"""
