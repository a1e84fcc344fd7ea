"""A recorded reading goes one of two ways (gpudoctor.watch.bounds): the plain check takes it as it is,
or the strict checks say what is wrong. Whichever way, the reading, the drops and the rejection are
the same as the strict checks alone make them."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudoctor.watch.bounds import MAX_GPUS, MAX_RANKS
from gpudoctor.watch.model import GpuReading, HostReading, ProcReading, RankReading, Sample
from gpudoctor.watch.recording import MAX_BLANK, MAX_CONTAINERS, MAX_DAMAGED_FIRST, MAX_LINE, RecordingStream
from gpudoctor.watch.synthetic import synthetic_run
from tests.helpers.cli import run_cli
from tests.helpers.processes import clean_env

# Values that each rule of the strict checks has an opinion about: bools (not numbers), whole floats
# in whole-number fields, fractions there, NaN and infinities, ints past the largest float, values at
# and beyond each bound, the wrong types, and None.
odd_values = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            100,
            101,
            -50,
            -51,
            200,
            201,
            4.0,
            4.5,
            -0.5,
            0.0,
            -0.0,
            1e308,
            math.nan,
            math.inf,
            -math.inf,
            10**400,
            2**32,
            2**32 - 1,
            "",
            "7",
            "name\x1b[31m",
            [],
            [48],
            [48.0],
            [True],
            {},
        ]
    ),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
GOOD = {
    GpuReading: {
        "index": 3,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-1",
        "util": 97,
        "mem_util": 40,
        "mem_used": 61000,
        "mem_total": 81559,
        "power": 612.5,
        "power_limit": 700.0,
        "temp": 65,
        "sm_clock": 1980,
        "pcie_rx": 2000,
        "pcie_tx": 1000,
        "throttle": 0,
        "xids": [48],
    },
    ProcReading: {
        "pid": 4100,
        "gpu": 0,
        "gpu_mem": 60000,
        "user": "train",
        "cpu": 97.5,
        "rss": 9000,
        "command": "python train.py",
        "sm": 90,
        "started": 1.7e9,
    },
    RankReading: {
        "pid": 4100,
        "rank": 0,
        "steps": 2,
        "step_s": 0.5,
        "step_max": 0.52,
        "wait_s": 0.01,
        "last_step": 120,
        "last_end": 1.7e9,
    },
    HostReading: {"load1": 3.5, "ram_used": 1000, "ram_total": 2000, "swap_used": 0, "swap_total": 0},
}


def outcome(parse: Any, data: Any) -> tuple[str, str, list[str]]:
    dropped: list[str] = []
    try:
        reading = parse(data, dropped)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # what RecordingStream catches
        return ("rejected", f"{type(exc).__name__}: {exc}", dropped)
    return ("taken", repr(reading), dropped)  # repr: 4 and 4.0 differ, so a kept type is compared too


@st.composite
def recorded(draw: st.DrawFn) -> tuple[type, Any]:
    cls = draw(st.sampled_from(sorted(GOOD, key=lambda c: c.__name__)))
    data = dict(GOOD[cls])
    for name in draw(st.lists(st.sampled_from([*data, "state", "note", "extra_field"]), max_size=4)):
        if draw(st.booleans()) and name in data:
            del data[name]
        else:
            data[name] = draw(odd_values)
    if cls is GpuReading and draw(st.booleans()):
        data["state"] = draw(st.sampled_from(["ok", "stale", "lost", "gone", None]))
    return cls, data if draw(st.integers(0, 30)) else draw(odd_values)


@settings(max_examples=3000, deadline=None)
@given(recorded())
def test_the_plain_way_and_the_strict_way_read_a_reading_alike(case: tuple[type, Any]) -> None:
    cls, data = case
    assert outcome(cls.parse, data) == outcome(cls.parse_strict, data)


def test_a_sound_reading_is_taken_the_plain_way_and_equals_the_strict_one() -> None:
    for cls, data in GOOD.items():
        dropped: list[str] = []
        plain, strict = cls.parse(data, dropped), cls.parse_strict(data, [])
        assert plain == strict and repr(plain) == repr(strict) and not dropped
    assert GpuReading.parse({"index": 0, "name": "a\x1b[2Jb"}, []).name == "a?[2Jb"  # cleaned either way


def _recording(path: Path, lines: list[Any]) -> Path:
    """A recording: the header, then each of `lines` (a Sample, or a document written as it is)."""
    with path.open("w") as f:
        f.write(json.dumps({"format": "gpudoctor-watch", "version": 1, "interval": 1.0}) + "\n")
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line.to_json())) + "\n")
    return path


def _wide(base: Sample, n_gpus: int = 0, n_ranks: int = 0) -> Sample:
    gpus = tuple(dataclasses.replace(base.gpus[0], index=i) for i in range(n_gpus)) if n_gpus else base.gpus
    ranks = tuple(RankReading(pid=1000 + i, rank=i, steps=1, step_s=0.5) for i in range(n_ranks))
    return dataclasses.replace(base, gpus=gpus, ranks=ranks if n_ranks else base.ranks)


def test_a_line_beyond_one_machine_is_refused_said_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24: a line of 32,000 GPUs cost `report` 30 s (quadratic) and any count was taken. More GPUs
    than MAX_GPUS or ranks than MAX_RANKS in a line: refused before its readings are made, counted,
    said, the rest summarized, exit 2 (bad input, as a corrupt gzip)."""
    run = synthetic_run("straggler", 6, ranks=True)
    lines = [run[0], _wide(run[1], n_gpus=MAX_GPUS + 1), run[2], _wide(run[3], n_ranks=MAX_RANKS + 1), *run[4:]]
    rec = _recording(tmp_path / "wide.jsonl", lines)
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 2 and "internal error" not in r.err and len(r.err.splitlines()) == 1
    doc = json.loads(r.out)
    assert doc["samples"] == 4
    assert (
        f"refused 2 lines beyond one machine's bounds (line 3: {MAX_GPUS + 1} GPUs, at most {MAX_GPUS}"
        in (doc["damage"])
    )
    replay = run_cli(capsys, "watch", "--replay", str(rec), "--no-tui", "--json", "--speed", "100000")
    assert replay.exit_code == 2 and json.loads(replay.out.splitlines()[-1])["samples"] == 4
    # At the bounds: taken.
    rec = _recording(tmp_path / "edge.jsonl", [_wide(run[0], MAX_GPUS, MAX_RANKS), *run[1:]])
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 0 and json.loads(r.out)["samples"] == 6 and len(json.loads(r.out)["gpus"]) == MAX_GPUS


def test_a_line_that_would_parse_into_millions_of_objects_is_refused_unparsed(tmp_path: Path) -> None:
    """A gzip bomb's line within MAX_LINE of empty objects ("{}", 64 bytes each once parsed): 417 MB
    before (issue 24); refused by counting its brackets, so the memory it costs stays near its text's."""
    n = (MAX_LINE - 100) // 3
    bomb = _recording(tmp_path / "bomb.jsonl", ['{"t":1,"gpus":[' + ",".join(["{}"] * n) + "]}"])
    stream = RecordingStream(str(bomb))
    tracemalloc.start()
    try:
        assert list(stream) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stream.bad_input and f"line 2: {n + 2} objects and lists, at most {MAX_CONTAINERS}" in (stream.damage or "")
    assert peak < 4 * MAX_LINE  # the line's text (a str per read) and no objects: was ~50x the line


def test_a_line_of_exactly_max_line_characters_is_taken_and_one_more_is_damage(tmp_path: Path) -> None:
    """The bound counts the line's characters, not its newline (a hostile review: MAX_LINE was refused)."""
    base = synthetic_run("straggler", 1)[0].to_json()
    text = json.dumps(base)
    pad = MAX_LINE - len(text) - len(', "pad": ""')
    at = json.dumps({**base, "pad": "p" * pad})
    assert len(at) == MAX_LINE
    over = json.dumps({**base, "pad": "p" * (pad + 1)})
    for line, samples in ((at, 1), (over, 0)):
        stream = RecordingStream(str(_recording(tmp_path / "edge.jsonl", [line])))
        assert len(list(stream)) == samples
        assert (stream.damage is None) == (samples == 1), stream.damage


def test_a_stream_of_blank_lines_ends_the_reading_as_bad_input(tmp_path: Path) -> None:
    """A small gzip of millions of newlines kept `report` busy for minutes (a hostile review): blank lines in a
    row beyond MAX_BLANK end the reading, the samples before kept, and the file is bad input (exit 2)."""
    rec = _recording(tmp_path / "blank.jsonl", [synthetic_run("straggler", 1)[0]])
    with rec.open("a") as f:
        f.write("\n" * (MAX_BLANK + 1) + "not read\n")
    stream = RecordingStream(str(rec))
    assert len(list(stream)) == 1
    assert stream.bad_input and f"more than {MAX_BLANK} blank lines from line 3" in (stream.damage or "")
    short = _recording(tmp_path / "few.jsonl", [synthetic_run("straggler", 1)[0]])
    with short.open("a") as f:
        f.write("\n" * 10)
    stream = RecordingStream(str(short))
    assert len(list(stream)) == 1 and not stream.bad_input  # a few blank lines are nothing


def test_a_recording_whose_gpus_keep_changing_is_refused_past_one_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile review 2, M2: each line within MAX_GPUS, but new GPU indices on every line: `report` kept
    every GPU it ever saw (102,400 from 400 lines, 219 MB). A recording is one machine's: the lines that
    bring it past MAX_GPUS distinct GPUs in all are refused (counted, the first named, exit 2)."""
    base = synthetic_run("healthy", 10)
    per = MAX_GPUS // 4
    lines = [_wide(s, per) for s in base]
    lines = [
        dataclasses.replace(s, gpus=tuple(dataclasses.replace(g, index=i * per + g.index) for g in s.gpus))
        for i, s in enumerate(lines)
    ]
    rec = _recording(tmp_path / "moving.jsonl", lines)
    r = run_cli(capsys, "report", "--json", str(rec))
    assert r.exit_code == 2 and "internal error" not in r.err and len(r.err.splitlines()) == 1
    doc = json.loads(r.out)
    assert doc["samples"] == 4 and len(doc["gpus"]) == MAX_GPUS
    assert (
        f"refused 6 lines beyond one machine's bounds (line 6: GPU {MAX_GPUS} would be GPU {MAX_GPUS + per} "
        f"of the recording, at most {MAX_GPUS}; ...)" in doc["damage"]
    )
    replay = run_cli(capsys, "watch", "--replay", str(rec), "--no-tui", "--json", "--speed", "100000")
    assert replay.exit_code == 2 and json.loads(replay.out.splitlines()[-1])["samples"] == 4
    # The same GPUs line after line (and fewer on some lines): one machine, taken.
    same = _recording(tmp_path / "same.jsonl", [_wide(s, MAX_GPUS if i % 2 else 8) for i, s in enumerate(base)])
    r = run_cli(capsys, "report", "--json", str(same))
    assert r.exit_code == 0 and json.loads(r.out)["samples"] == 10


def _junk_after(path: Path, first: list[Any], junk: int) -> Path:
    rec = _recording(path, first)
    with rec.open("a") as f:
        f.write("x\n" * junk)
    return rec


def _peak(path: Path) -> int:
    stream = RecordingStream(str(path))
    tracemalloc.start()
    try:
        list(stream)
        _ = stream.damage
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_damaged_lines_are_counted_not_kept(tmp_path: Path) -> None:
    """Hostile review 2, M3: every damaged line's number was kept (2 million junk lines, a 4 KB gzip:
    99 MB). Now a count and the first few numbers: memory does not grow with the damage."""
    sample = synthetic_run("healthy", 1)
    few = _peak(_junk_after(tmp_path / "few.jsonl", sample, 1_000))
    many_path = _junk_after(tmp_path / "many.jsonl", sample, 50_000)
    many = _peak(many_path)
    assert many < few + 256 * 1024, (few, many)  # the 49,000 more line numbers alone were ~1.7 MB
    stream = RecordingStream(str(many_path))
    assert len(list(stream)) == 1 and not stream.bad_input  # a sample and damage: read on to the end
    assert "lines 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 and 49990 more of" in (stream.damage or "")


def test_a_recording_with_no_usable_sample_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile review 2, M3: a recording whose every line was damaged exited 0 with "0 samples". It is
    bad input: one line, exit 2; reading stops after MAX_DAMAGED_FIRST damaged lines with no sample."""
    short = _junk_after(tmp_path / "short.jsonl", [], 5)
    r = run_cli(capsys, "report", str(short))
    assert r.exit_code == 2 and r.out == ""
    assert r.err.strip().splitlines() == [
        f"gpudoctor: recording {short} has no usable sample: lines 2, 3, 4, 5, 6 of {short} are damaged "
        "(first: not JSON); skipped them"
    ]
    long = _junk_after(tmp_path / "long.jsonl", [], MAX_DAMAGED_FIRST * 10)
    stream = RecordingStream(str(long))
    assert list(stream) == [] and stream.bad_input
    assert f"stopped reading {long} at line {MAX_DAMAGED_FIRST + 1}: {MAX_DAMAGED_FIRST} damaged lines" in (
        stream.damage or ""
    )
    replay = run_cli(capsys, "watch", "--replay", str(short), "--no-tui", "--speed", "1000")
    assert replay.exit_code == 2
    # A header alone (a watch stopped before its first sample) is no damage: an empty summary, exit 0.
    empty = _recording(tmp_path / "empty.jsonl", [])
    assert run_cli(capsys, "report", str(empty)).exit_code == 0


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_closed_output_keeps_reports_exit_code(tmp_path: Path, closed: str) -> None:
    """Hostile review 2, M6: with its reader gone, `report` of a damaged recording exited 0 (stdout) or 1
    (stderr) instead of 2; it keeps its code as `check` does, and says why on the stream still open."""
    run = synthetic_run("straggler", 3)
    rec = _recording(tmp_path / "refused.jsonl", [run[0], _wide(run[1], n_gpus=MAX_GPUS + 1), run[2]])
    read, write = os.pipe()
    os.close(read)
    try:
        streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, closed: write}
        r = subprocess.run(
            [sys.executable, "-m", "gpudoctor", "report", str(rec)], env=clean_env(), timeout=60, **streams
        )
    finally:
        os.close(write)
    assert r.returncode == 2
    if closed == "stdout":
        assert b"is damaged" in r.stderr and b"internal error" not in r.stderr
    healthy = _recording(tmp_path / "healthy.jsonl", run)
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, "-m", "gpudoctor", "report", str(healthy)],
            env=clean_env(),
            timeout=60,
            stdout=write,
            stderr=subprocess.PIPE,
        )
    finally:
        os.close(write)
    assert r.returncode == 0 and r.stderr == b""
