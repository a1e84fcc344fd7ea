"""gpudoctor.knowledge.clock_reasons: NVML's clock event reason bits, one meaning each."""

from __future__ import annotations

from gpudoctor.knowledge import clock_reasons


def test_clock_reason_table_uses_nvml_bits_and_one_meaning_per_bit() -> None:
    # nvml.h nvmlClocksEventReason* values, written out here rather than read from the code.
    raw = {0x1: "benign", 0x2: "benign", 0x4: "power", 0x8: "hardware", 0x10: "benign", 0x20: "thermal"}
    raw |= {0x40: "thermal", 0x80: "power", 0x100: "benign"}
    assert {r.bit: r.kind for r in clock_reasons.REASONS} == raw
    assert clock_reasons.kinds(0x8 | 0x1) == {"hardware"}
