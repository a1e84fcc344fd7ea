"""Where the tests' data lives, for test modules at any depth under tests/, and the files there
that many tests read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
REFERENCE = TESTS / "reference"
FAKE_SITE = str(TESTS / "fakes" / "site")  # on PYTHONPATH: GPUDOCTOR_TEST_HIDE=numpy,torch hides them

# The recorded machines most tests run `check --snapshot` on.
H100 = str(FIXTURES / "h100_sxm_8x.json")  # 8x H100 SXM on NVSwitch: a healthy machine
MIXED = str(FIXTURES / "rtx4090_2x_rtx4080_1x.json")  # an RTX 4080 among 4090s: GD302 fails
CONTAINER = str(FIXTURES / "container_32gb_8gpu.json")  # 8 GPUs, 32 GB RAM: fails GD501, warns, passes


def shipped_schema(name: str) -> dict[str, Any]:
    """gpudoctor/schemas/NAME.schema.json, as the package ships it."""
    return json.loads((REPO / "gpudoctor" / "schemas" / f"{name}.schema.json").read_text())
