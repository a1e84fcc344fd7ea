"""gpudoctor.knowledge.units: one convention for sizes, binary units labelled GiB/MiB."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [
        (81559 * 2**20, "80 GiB"),  # H100 80GB: 81559 MiB
        (16376 * 2**20, "16 GiB"),  # RTX 4080: binary, never a decimal "17 GB"
        (1152 * 2**30, "1152 GiB"),
        (2**30, "1 GiB"),
        (int(7.5 * 2**30), "7.5 GiB"),
        (64 * 2**20, "64 MiB"),
        (64 * 1024, "64 KiB"),
    ],
)
def test_one_size_convention_binary_units_labelled_gib_mib(n_bytes: int, text: str) -> None:
    from gpudoctor.knowledge import units

    assert units.size(n_bytes) == text
    assert units.size_mib(n_bytes / 2**20) == text
