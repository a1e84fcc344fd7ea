"""The `gpudoctor` command line: click commands only; the work lives in the layers below."""
