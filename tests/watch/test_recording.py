"""Recordings: record then replay gives the same samples; damage is reported; `gpudoctor report`."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import resource
import signal
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

import jsonschema
import psutil
import pytest

from gpudoctor.errors import UserError
from gpudoctor.watch.data_model import DataReading, Hello
from gpudoctor.watch.follow import Job
from gpudoctor.watch.headless import run_headless
from gpudoctor.watch.model import RankReading, Sample
from gpudoctor.watch.model import clock as clock_text
from gpudoctor.watch.recording import MAX_LINE, RecordWriter, read_recording, recording_path
from gpudoctor.watch.session import Session
from gpudoctor.watch.sources import ReplaySource, SyntheticSource
from gpudoctor.watch.summary import summarize_recording
from gpudoctor.watch.synthetic import synthetic_run
from tests.helpers.cli import run_cli
from tests.helpers.processes import GpudoctorCli, clean_env
from tests.paths import FIXTURES, shipped_schema

RECORDINGS = FIXTURES / "recordings"
SCHEMA = shipped_schema("watch_summary")


def test_record_then_replay_gives_the_same_samples(tmp_path: Path) -> None:
    samples = synthetic_run("straggler", 25)
    path = tmp_path / "run.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in samples:
        writer.write(s)
    writer.close()
    rec = read_recording(str(path))
    assert rec.samples == samples and rec.damage is None
    # and through a live session: what the session records is what the replay source yields
    out = tmp_path / "again.jsonl"
    session = Session(ReplaySource(rec, speed=1000.0), record_path=str(out))
    session.start()
    try:
        assert run_headless(session, open("/dev/null", "w")) == "source"
    finally:
        session.close()
    assert read_recording(str(out)).samples == samples


def test_the_jobs_last_words_end_the_recording_and_count_as_steps_not_as_a_sample(tmp_path: Path) -> None:
    """Review 6 F7: what a job sends after the last sample is the recording's last line (Sample.end). `report`
    and a replay count its steps and data, not a sample; a replay recorded again keeps it."""
    samples = synthetic_run("healthy", 5)
    late = (RankReading(pid=11, rank=0, steps=7, step_s=0.1, last_step=12), RankReading(pid=12, rank=1, steps=0))
    data = (DataReading(11, 0, Hello(cpus=4)),)
    path = tmp_path / "run.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in samples:
        writer.write(s)
    writer.write_end(Sample(t=samples[-1].t + 0.5, gpus=(), ranks=late, data=data, end=True))
    writer.close()
    assert json.loads(path.read_text().splitlines()[-1])["end"] is True
    rec = read_recording(str(path))
    assert rec.samples == samples and rec.end is not None and rec.end.ranks == late and rec.damage is None
    summary = summarize_recording(str(path))
    assert summary.samples == 5 and summary.duration_s == pytest.approx(samples[-1].t - samples[0].t)
    rows = summary.to_json()["ranks"]
    assert [(x["rank"], x["steps"], x["last_step"]) for x in rows] == [(0, 7, 12), (1, 0, None)]
    again = tmp_path / "again.jsonl"
    session = Session(ReplaySource.open_file(str(path), speed=1000.0), record_path=str(again))
    session.start()
    try:
        assert run_headless(session, open("/dev/null", "w")) == "source"
    finally:
        session.close()
    assert session.summary().to_json()["ranks"] == rows
    assert summarize_recording(str(again)).to_json()["ranks"] == rows
    writer = RecordWriter(str(tmp_path / "quiet.jsonl"), {})
    writer.write_end(Sample(t=1.0, gpus=(), ranks=(), end=True))  # nothing said: no line
    writer.close()
    assert len((tmp_path / "quiet.jsonl").read_text().splitlines()) == 1


def test_a_replay_stopped_before_the_end_does_not_count_the_jobs_last_words(tmp_path: Path) -> None:
    """Review 7: the replay's read-ahead (30 samples) saw the end line of a short recording at once, and a replay
    stopped early (--duration, q) counted the job's last steps it never reached."""
    samples = synthetic_run("healthy", 10)
    path = tmp_path / "short.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in samples:
        writer.write(s)
    last = (RankReading(pid=11, rank=0, steps=1000, step_s=0.1, last_step=1000),)
    writer.write_end(Sample(t=samples[-1].t + 0.5, gpus=(), ranks=last, end=True))
    writer.close()
    session = Session(ReplaySource.open_file(str(path), speed=1.0))
    session.start()
    try:
        assert run_headless(session, open("/dev/null", "w"), duration=1.5) == "duration"
    finally:
        session.close()
    assert session.summary().to_json()["ranks"] == []


def test_a_stop_signal_while_a_sample_is_handled_leaves_it_both_recorded_and_counted(tmp_path: Path) -> None:
    """Review 7: SIGTERM landing after a sample was written but before the summary counted it (the job tree is
    read between): `report` of the file counted one sample and its steps more than `watch` had said."""
    from gpudoctor.safety import signals

    path = tmp_path / "stopped.jsonl"
    session = Session(SyntheticSource("healthy", 2, 0.1, 5.0, ranks=True, speed=1.0), record_path=str(path))
    calls = [0]
    real = session.filter

    def signalled(raw: Sample) -> Sample:
        calls[0] += 1
        if calls[0] == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-sample, after it was written
        return real(raw)

    session.filter = signalled  # type: ignore[method-assign]
    before = {sig: signal.getsignal(sig) for sig in signals.HELD}
    signals.install()
    try:
        session.start()
        with pytest.raises(KeyboardInterrupt):
            run_headless(session, open("/dev/null", "w"))
    finally:
        session.close()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    live, reported = session.summary().to_json(), summarize_recording(str(path)).to_json()
    assert live["samples"] == reported["samples"] == 5 and live["ranks"] == reported["ranks"]


def test_two_readings_of_one_process_make_one_with_the_same_totals() -> None:
    """The last words merge what was taken into one reading per process (a recording line holds one)."""
    a = RankReading(
        pid=5,
        rank=0,
        steps=4,
        step_s=0.1,
        step_max=0.2,
        wait_s=0.01,
        waited=2,
        wait_step_s=0.1,
        last_step=4,
        last_end=10.0,
    )
    b = RankReading(
        pid=5,
        rank=0,
        steps=6,
        step_s=0.2,
        step_max=0.3,
        wait_s=0.02,
        waited=6,
        wait_step_s=0.2,
        last_step=10,
        last_end=11.0,
    )
    both = a.then(b)
    assert (both.steps, both.last_step, both.last_end, both.step_max) == (10, 10, 11.0, 0.3)
    assert both.step_s * both.steps == pytest.approx(a.step_s * 4 + b.step_s * 6)
    assert both.wait_totals() == pytest.approx(
        tuple(x + y for x, y in zip(a.wait_totals(), b.wait_totals(), strict=True))
    )
    idle = RankReading(pid=5, rank=0, steps=0, last_step=10, last_end=11.0)
    assert a.then(idle) == RankReading(**{**dataclasses.asdict(a), "last_step": 10, "last_end": 11.0})
    assert idle.then(b) == b


def test_recording_is_flushed_per_sample(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    writer = RecordWriter(str(path), {})
    for s in synthetic_run("healthy", 3):
        writer.write(s)
    # not closed: a reader (or a kill) sees every finished line already
    assert len(read_recording(str(path)).samples) == 3
    writer.close()


def test_truncated_recording_replays_up_to_the_damage() -> None:
    rec = read_recording(str(RECORDINGS / "truncated.jsonl"))
    assert len(rec.samples) == 40
    assert rec.damage is not None and "line 42" in rec.damage and "cut off mid-line" in rec.damage
    full = read_recording(str(RECORDINGS / "healthy.jsonl"))
    assert rec.samples == full.samples[:40]


def test_not_a_recording_is_a_usage_error(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(UserError, match="not a gpudoctor watch recording"):
        read_recording(str(bad))
    r = gpudoctor_cli("report", str(bad))
    assert r.returncode == 2 and "not a gpudoctor watch recording" in r.stderr and "Traceback" not in r.stderr
    r = gpudoctor_cli("report", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "cannot read recording" in r.stderr


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("9" * 5000, "a number of more than"),
        ("NaN", "NaN is not a number JSON allows"),
        ("[" * 50_000 + "]" * 50_000, "nested"),
    ],
    ids=["huge-int", "nan", "deep"],
)
def test_a_damaged_header_is_called_damaged_not_missing(tmp_path: Path, value: str, why: str) -> None:
    """A header line of ours that json will not read (a huge number, NaN, deep nesting) says what is wrong
    with it; a first line that is not ours at all is still "not a gpudoctor watch recording"."""
    bad = tmp_path / "x.jsonl"
    bad.write_text(f'{{"format":"gpudoctor-watch","version":1,"interval":{value}}}\n')
    with pytest.raises(UserError, match=f"header line of recording .* is damaged \\({why}") as raised:
        read_recording(str(bad))
    assert raised.value.exit_code == 2
    bad.write_text(f"{value}\n")
    with pytest.raises(UserError, match="not a gpudoctor watch recording"):
        read_recording(str(bad))


@pytest.mark.parametrize(
    ("first", "said"),
    [
        ('{"format":"gpudoctor-watch","version":1', "the header line of recording .* is damaged \\(not JSON\\)"),
        ('{"format":"other","note":"gpudoctor-watch","version":NaN}', "not a gpudoctor watch recording"),
        ('["gpudoctor-watch", NaN]', "not a gpudoctor watch recording"),
        ('{"format":"gpudoctor-watch","version":true}', "has format version true; this gpudoctor reads version 1$"),
        ('{"format":"gpudoctor-watch","version":' + "9" * 4000 + "}", "version 99999999999999999999\\.\\.\\.;"),
    ],
    ids=["cut-off", "ours-only-in-a-value", "a-list", "version-true", "version-4000-digits"],
)
def test_a_header_that_is_not_ours_or_not_readable_says_which_in_a_short_line(
    tmp_path: Path, first: str, said: str
) -> None:
    """The review of the damaged-header message: only a line that begins as our header is called a damaged
    header; a version is a whole number (true is no version) and is quoted short, as the file has it."""
    bad = tmp_path / "x.jsonl"
    bad.write_text(first + "\n")
    with pytest.raises(UserError, match=said) as raised:
        read_recording(str(bad))
    assert len(str(raised.value)) < 200


def test_a_byte_order_mark_before_the_header_is_read_past(tmp_path: Path) -> None:
    rec = tmp_path / "bom.jsonl"
    rec.write_text('\ufeff{"format":"gpudoctor-watch","version":1}\n{"t":1700000000,"gpus":[{"index":0,"util":5}]}\n')
    assert len(read_recording(str(rec)).samples) == 1


def test_bytes_that_are_not_utf_8_keep_their_line_and_are_said(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    """A recorded GPU name with bytes that are not UTF-8 (a damaged byte, another writer): the line is kept,
    read with U+FFFD, and the note says which lines (last session's review: it was read silently)."""
    head = json.dumps({"format": "gpudoctor-watch", "version": 1, "interval": 1.0}).encode()
    lines = [head]
    for i in range(5):
        name = b"H100\xff\xfe" if i in (1, 3) else b"H100"
        lines.append(b'{"t":%d,"gpus":[{"index":0,"name":"%s","util":50}]}' % (1_700_000_000 + i, name))
    rec = tmp_path / "bytes.jsonl"
    rec.write_bytes(b"\n".join(lines) + b"\n")
    r = gpudoctor_cli("report", "--json", str(rec))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["samples"] == 5 and doc["damage"] == "line 3 and 1 more held bytes that are not UTF-8, read as U+FFFD"
    escaped = b'{"t":1700000009,"gpus":[{"index":0,"name":"H100\\ufffd","util":50}]}'  # as our writer writes it
    rec.write_bytes(b"\n".join([*lines[:2], escaped]) + b"\n")
    doc = json.loads(gpudoctor_cli("report", "--json", str(rec)).stdout)
    assert doc["damage"] is None and doc["gpus"][0]["name"] == "H100\ufffd"


def test_report_text_names_the_straggler(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("report", str(RECORDINGS / "straggler.jsonl"))
    assert r.returncode == 0, r.stderr
    assert "GD901 straggler" in r.stdout and "GPU 3 runs" in r.stdout and "balance score:" in r.stdout


def test_report_json_follows_the_schema_and_notes_damage(gpudoctor_cli: GpudoctorCli) -> None:
    for name in ("hung", "truncated", "healthy"):
        r = gpudoctor_cli("report", str(RECORDINGS / f"{name}.jsonl"), "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, SCHEMA)
        if name == "hung":
            assert [(v["code"], v["gpus"]) for v in doc["verdicts"]] == [("GD904", [5])]
        if name == "truncated":
            assert doc["samples"] == 40 and "line 42" in doc["damage"]
        if name == "healthy":
            assert doc["verdicts"] == [] and doc["balance_score"] >= 97


def test_replay_headless_json_lines_end_with_a_summary(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("watch", "--replay", str(RECORDINGS / "truncated.jsonl"), "--speed", "1000", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["kind"] for x in lines] == ["sample"] * 40 + ["summary"]
    jsonschema.validate(lines[-1], SCHEMA)
    assert "line 42" in r.stderr  # the damage is said, and the 40 good samples still played


def test_explain_watch_codes(gpudoctor_cli: GpudoctorCli) -> None:
    r = gpudoctor_cli("explain", "GD904")
    assert r.returncode == 0 and "hung-collective" in r.stdout and "gpudoctor watch" in r.stdout


FAKE = clean_env(GPUDOCTOR_WATCH_FAKE="healthy:8", PYTHONUNBUFFERED="1")


def _file_size_limit(limit: int):  # type: ignore[no-untyped-def]
    def apply() -> None:  # in the child: writes past `limit` bytes fail with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_stops_the_recording_not_the_watch(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    path = tmp_path / "run.jsonl"
    r = gpudoctor_cli(
        *["watch", "--no-tui", "--json", "--interval", "0.1", "--record", str(path)],
        *["--", sys.executable, "-c", "import time; time.sleep(2.5); raise SystemExit(7)"],
        env=FAKE,
        preexec_fn=_file_size_limit(6000),  # noqa: PLW1509  (a few samples fit, then the "disk" is full)
    )
    # The followed command ran to its end and its exit code came back: the failed write ended nothing.
    assert r.returncode == 7, r.stderr
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "recording" in line]
    assert len(said) == 1 and "stopped after" in said[0] and "File too large" in said[0], r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    summary = lines[-1]
    assert summary["kind"] == "summary" and summary["exit_code"] == 7
    assert "File too large" in summary["damage"]
    jsonschema.validate(summary, SCHEMA)
    rec = read_recording(str(path))  # every line written before the failure is still there
    assert 0 < len(rec.samples) < summary["samples"]
    assert f"stopped after {len(rec.samples)} samples" in summary["damage"]


def test_a_recording_that_cannot_be_started_is_exit_3(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    with pytest.raises(UserError, match="cannot write recording /dev/full: No space left on device"):
        RecordWriter("/dev/full", {})
    r = gpudoctor_cli("watch", "--no-tui", "--duration", "1", "--record", "/dev/full", env=FAKE)
    assert r.returncode == 3 and r.stderr.strip().count("\n") == 0 and "No space left" in r.stderr


def test_closing_a_session_always_stops_its_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_close(self: RecordWriter) -> None:
        raise RuntimeError("cannot close")

    monkeypatch.setattr(RecordWriter, "close", broken_close)
    job = Job.start([sys.executable, "-c", "import time; time.sleep(60)"])
    session = Session(SyntheticSource(interval=0.1), record_path=str(tmp_path / "r.jsonl"), job=job)
    session.start()
    with pytest.raises(RuntimeError, match="cannot close"):
        session.close()
    assert job.poll() is not None  # stopped, not orphaned
    assert not psutil.pid_exists(job.root.pid) or psutil.Process(job.root.pid).status() == psutil.STATUS_ZOMBIE


def test_report_reads_a_recording_as_a_stream(tmp_path: Path) -> None:
    base = synthetic_run("straggler", 60)
    path = tmp_path / "long.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for i in range(800):
        writer.write(dataclasses.replace(base[i % 60], t=1000.0 + i))
    writer.close()
    tracemalloc.start()
    try:
        summary = summarize_recording(str(path))
        _, streamed = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        whole = read_recording(str(path))  # what `report` used to hold: every sample at once
        _, listed = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.samples == len(whole.samples) == 800 and summary.damage is None
    assert [(sp.verdict.code, sp.verdict.gpus) for sp in summary.spans] == [("GD901", (3,))]
    assert streamed < listed / 5, (streamed, listed)  # memory does not grow with the recording
    damaged = summarize_recording(str(RECORDINGS / "truncated.jsonl"))
    assert damaged.samples == 40 and damaged.damage and "line 42" in damaged.damage


def _strict_json(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def _edited(tmp_path: Path, edits: dict[int, str], name: str = "edited") -> Path:
    """healthy.jsonl (header + 90 samples) with some lines (1-based numbers) replaced."""
    lines = (RECORDINGS / "healthy.jsonl").read_text().splitlines()
    for number, text in edits.items():
        lines[number - 1] = text
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _line(number: int) -> dict:  # type: ignore[type-arg]
    return json.loads((RECORDINGS / "healthy.jsonl").read_text().splitlines()[number - 1])


def test_a_nan_time_is_a_damaged_line_not_an_internal_error(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    bad = json.dumps(_line(11)).replace(str(_line(11)["t"]), "NaN", 1)
    inf = json.dumps(_line(12)).replace(str(_line(12)["t"]), "Infinity", 1)
    path = _edited(tmp_path, {11: bad, 12: inf})
    r = gpudoctor_cli("report", str(path))
    assert r.returncode == 0, r.stderr
    assert "lines 11, 12 of" in r.stdout and "skipped them" in r.stdout and "88 samples" in r.stdout
    r = gpudoctor_cli("report", str(path), "--json")
    assert r.returncode == 0, r.stderr
    doc = _strict_json(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["samples"] == 88 and doc["duration_s"] == 89.0  # type: ignore[index]


def test_one_damaged_line_in_the_middle_keeps_every_good_sample_after_it(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    path = _edited(tmp_path, {6: '{"t": 1700000004.0, "gpus": [{"ind', 30: "garbage", 31: '{"t": "soon", "gpus": []}'})
    rec = read_recording(str(path))
    assert len(rec.samples) == 90 - 3
    full = read_recording(str(RECORDINGS / "healthy.jsonl")).samples
    assert rec.samples == full[:4] + full[5:28] + full[30:]
    assert rec.damage is not None and "lines 6, 30, 31 of" in rec.damage and "skipped them" in rec.damage
    one = read_recording(str(_edited(tmp_path, {50: "{}"}, "one")))
    assert len(one.samples) == 89 and one.damage and "line 50 of" in one.damage and "skipped it" in one.damage
    # replay goes on past the damage too, and says it
    r = gpudoctor_cli("watch", "--replay", str(path), "--speed", "1000", "--json")
    assert r.returncode == 0 and "lines 6, 30, 31" in r.stderr
    assert [_strict_json(x)["kind"] for x in r.stdout.splitlines()] == ["sample"] * 87 + ["summary"]  # type: ignore[index]


def test_readings_outside_the_physical_range_are_ignored_and_said(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    edits = {}
    for number in range(2, 92):
        doc = _line(number)
        doc["gpus"][0]["util"] = -5000  # every reading of GPU 0
        doc["gpus"][1]["power"] = -1.0
        if number == 5:
            doc["gpus"][2]["util"] = 250
            doc["gpus"][3]["mem_used"] = 10**9  # more than the GPU holds
        edits[number] = json.dumps(doc)
    path = _edited(tmp_path, edits)
    r = gpudoctor_cli("report", str(path), "--json")
    assert r.returncode == 0, r.stderr
    doc = _strict_json(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    gpus = {g["index"]: g for g in doc["gpus"]}  # type: ignore[index]
    assert gpus[0]["mean_util"] is None  # no valid reading: n/a, not -5000
    assert all(g["mean_util"] is None or 0 <= g["mean_util"] <= 100 for g in gpus.values())
    assert gpus[3]["peak_mem_mib"] <= 81559
    assert 0 <= doc["balance_score"] <= 100  # type: ignore[index]
    assert "ignored 182 readings outside the physical range" in doc["damage"]  # type: ignore[index]
    assert "GPU 0 util -5000" in doc["damage"]  # type: ignore[index]
    r = gpudoctor_cli("report", str(path))
    assert "-5000%" not in r.stdout and "n/a" in r.stdout


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("ranks", "step_s", 1e308),
        ("ranks", "wait_s", 1e308),
        ("ranks", "steps", 1e308),
        ("ranks", "step_s", 1e6),  # 11 days: no step, however slow
        ("ranks", "last_end", 1e300),
        ("loader", "s", 1e308),
    ],
)
def test_absurd_step_and_loader_figures_are_ignored_and_said_not_an_internal_error(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli, where: str, field: str, value: float
) -> None:
    """The review: a rank's step time of 1e308 in a recording ended `report` and `watch --replay` as an
    internal error (an OverflowError, exit 3), and a step of 11 days was taken. The live channel's bounds
    (a step of at most a day, step numbers below 2**53) hold a recording too: the value is n/a, said."""
    lines = gzip.open(recording_path("sample:straggler"), "rt").read().splitlines()
    out = lines[:1]
    for number, line in enumerate(lines[1:], 2):
        doc = json.loads(line)
        rank = doc["ranks"][0]
        if where == "loader":
            if number == 5:  # a rank's data reading is strict: the line is damaged, skipped
                doc["data"] = [{"pid": rank["pid"], "rank": rank["rank"], "loader": {"s": value, "batches": 3}}]
        else:
            rank[field] = value
        out.append(json.dumps(doc))
    path = tmp_path / "absurd.jsonl"
    path.write_text("\n".join(out) + "\n")
    for args in (("report", str(path)), ("watch", "--replay", str(path), "--no-tui", "--speed", "100000")):
        r = gpudoctor_cli(*args)
        assert "internal error" not in r.stderr, r.stderr
        said = r.stdout + r.stderr
        if where == "loader":
            assert r.returncode == 0 and "line 5 of" in said and "loader s is not a number in [0, 86400]" in said
        else:
            assert r.returncode == 0 and f"PID {rank['pid']} {field} {value!r}" in said, said[-600:]
            assert "readings outside the physical range" in said


def test_counts_are_pluralised(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    path = tmp_path / "one.jsonl"
    writer = RecordWriter(str(path), {})
    writer.write(synthetic_run("healthy", 1)[0].only({0}))
    writer.close()
    r = gpudoctor_cli("report", str(path))
    assert r.returncode == 0 and "1 GPU, 1 sample over" in r.stdout
    assert "1 samples" not in r.stdout and "GPU(s)" not in r.stdout


def test_whole_floats_read_as_integers_and_huge_integers_are_damaged_lines(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    throttled = _line(6)
    throttled["gpus"][2]["throttle"] = 4.0  # a JSON writer's way of writing 4: before, an internal error
    throttled["gpus"][2]["util"] = 97.0
    half = _line(7)
    half["gpus"][1]["util"] = 96.5  # not a whole percentage NVML could report: n/a, said
    huge = _line(8)
    huge["gpus"][0]["mem_used"] = 10**400  # beyond float range: before, an OverflowError
    huge_pid = _line(12)
    huge_pid["procs"][0]["pid"] = 10**30
    edits = {6: throttled, 7: half, 8: huge, 12: huge_pid}
    path = _edited(tmp_path, {k: json.dumps(v) for k, v in edits.items()})
    rec = read_recording(str(path))
    by_t = {s.t: s for s in rec.samples}
    fixed = by_t[throttled["t"]].gpu(2)
    assert fixed is not None and fixed.throttle == 4 and isinstance(fixed.throttle, int) and fixed.util == 97
    assert by_t[half["t"]].gpu(1).util is None  # type: ignore[union-attr]
    assert huge["t"] not in by_t and huge_pid["t"] not in by_t
    assert rec.damage is not None and "lines 8, 12 of" in rec.damage and "too large for a number" in rec.damage
    assert "GPU 1 util 96.5" in rec.damage
    replay = ("watch", "--replay", str(path), "--speed", "1000", "--no-tui")
    for args in (("report", str(path)), ("report", str(path), "--json"), replay):
        r = gpudoctor_cli(*args)
        assert r.returncode == 0 and "internal error" not in r.stderr + r.stdout, (args, r.stderr)
        assert "lines 8, 12" in r.stdout + r.stderr


def test_empty_file_names_are_usage_errors(gpudoctor_cli: GpudoctorCli) -> None:
    cases = (("watch", "--record", ""), ("watch", "--replay", ""), ("report", ""), ("watch", "--json", "--replay", ""))
    for args in cases:
        r = gpudoctor_cli(*args, timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert "needs a file name, got ''" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_replay_skips_a_hole_in_the_recording_and_says_so(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    samples = synthetic_run("healthy", 6)
    late = [dataclasses.replace(s, t=s.t + 3600) for s in synthetic_run("healthy", 4, t0=samples[-1].t + 1)]
    path = tmp_path / "hole.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for s in samples + late:
        writer.write(s)
    writer.close()
    hole_wait_s = 3600 / 10  # the hour-long hole waited out at --speed 10
    start = time.monotonic()
    r = gpudoctor_cli("watch", "--replay", str(path), "--speed", "10", "--no-tui", timeout=hole_wait_s / 2)
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    # Seconds of replay (10 samples at 10x, the gap capped at 2 s) plus start-up, however loaded the
    # host: far below the wait a hole not skipped would cost, which is the point, not the seconds.
    assert took < hole_wait_s / 4
    assert r.stdout.count("util% [") == 10
    assert "replay skipped a 1:00:01 gap in the recording at t+00:05 (no samples; waits are capped at 2 s)" in r.stderr


class _Clock:
    """A stop event whose waits are counted, not slept: what a replay would wait, at no cost."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return False

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return False


def _spaced(tmp_path: Path, gap: float, count: int = 4) -> Path:
    path = tmp_path / f"gap{gap:g}.jsonl"
    writer = RecordWriter(str(path), {"interval": 1.0})
    for i, s in enumerate(synthetic_run("healthy", count)):
        writer.write(dataclasses.replace(s, t=1_700_000_000.0 + i * gap))
    writer.close()
    return path


@pytest.mark.parametrize("gap", [100.0, 3600.0, 1e7])
def test_a_replay_of_samples_far_apart_waits_at_most_2_s_each_and_says_so(tmp_path: Path, gap: float) -> None:
    # Every gap is the recording's own pace (its median), so a cap relative to it waited 100 s a frame.
    for speed in (1.0, 1000.0):
        source = ReplaySource.open_file(str(_spaced(tmp_path, gap)), speed=speed)
        clock = _Clock()
        played = [source.next(clock) for _ in range(5)]  # type: ignore[arg-type]
        assert [s is not None for s in played] == [True] * 4 + [False]
        assert clock.waits == [min(2.0, gap / speed)] * 3
        if gap / speed > 2:
            assert source.notes == [
                f"replay plays faster than recorded: its samples are {clock_text(gap)} apart "
                f"({gap / speed:g} s at {speed:g}x); waits are capped at 2 s"
            ]
        else:  # --speed still sets the pace below the cap
            assert source.notes == []


def test_a_replay_of_samples_100_s_apart_plays_in_seconds(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    start = time.monotonic()
    r = gpudoctor_cli("watch", "--replay", str(_spaced(tmp_path, 100.0)), "--no-tui", timeout=150)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - start < 100  # three 2 s waits and start-up, not 300 s of waiting
    assert r.stdout.count("util% [") == 4
    assert "replay plays faster than recorded: its samples are 01:40 apart (100 s at 1x)" in r.stderr


def test_a_time_past_year_9999_is_a_damaged_line_not_a_crash(tmp_path: Path, gpudoctor_cli: GpudoctorCli) -> None:
    huge = json.dumps(_line(11)).replace(str(_line(11)["t"]), "1e300", 1)
    path = _edited(tmp_path, {11: huge})
    for args in (("watch", "--replay", str(path), "--no-tui", "--speed", "1000"), ("report", str(path))):
        r = gpudoctor_cli(*args)
        assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
        assert "line 11 of" in r.stdout + r.stderr and "t is not a time" in r.stdout + r.stderr


def test_a_device_or_a_fifo_is_refused_and_a_huge_line_is_skipped_piece_by_piece(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    # `--replay /dev/zero` used to read forever into memory (6.9 GB in 6 s); a FIFO would block.
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a device"), (str(fifo), "a FIFO")):
        r = gpudoctor_cli("report", path)
        assert r.returncode == 2 and f"is {kind}, not a regular file" in r.stderr and len(r.stderr.splitlines()) == 1
    # A decompression bomb: one line of 20 MiB in a small gzip file is damage, skipped without
    # holding it whole; the samples around it are kept.
    lines = (RECORDINGS / "healthy.jsonl").read_text().splitlines()
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wt") as f:
        f.write("\n".join([*lines[:3], "x" * (20 << 20), *lines[3:]]) + "\n")
    r = gpudoctor_cli("report", str(bomb))
    assert r.returncode == 0, r.stderr
    assert "line 4 of" in r.stdout and f"damaged (longer than {MAX_LINE >> 20} MiB)" in r.stdout
    assert f"{len(lines) - 1} samples" in r.stdout


def _corrupt_gzip(data: bytes, wanted: type[Exception], start: int) -> bytes:
    """`data` (gzip) with 8 bytes overwritten at the first place from `start` where Python's own
    gzip reader then fails with `wanted` (zlib.error: a bad deflate block; BadGzipFile: a CRC)."""
    for pos in range(start, len(data) - 16, 97):
        damaged = data[:pos] + b"\xff" * 8 + data[pos + 8 :]
        try:
            gzip.decompress(damaged)
        except wanted:
            return damaged
        except Exception:  # noqa: BLE001  (another kind of failure: try further on)
            continue
    raise AssertionError(f"no place gives {wanted.__name__}")


def _straggler_gzip(tmp_path: Path) -> tuple[Path, bytes]:
    """A 300-sample straggler recording at tmp_path/run.jsonl, and its bytes gzipped."""
    plain = tmp_path / "run.jsonl"
    w = RecordWriter(str(plain), {"interval": 1.0})
    for s in synthetic_run("straggler", 300, seed=3):
        w.write(s)
    w.close()
    return plain, gzip.compress(plain.read_bytes())


@pytest.mark.parametrize("wanted", [zlib.error, gzip.BadGzipFile])
def test_a_corrupt_gzip_recording_exits_2_keeping_the_samples_before_the_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wanted: type[Exception]
) -> None:
    """Issue 24: a corrupt compressed stream was an internal error (exit 3) losing every sample."""
    plain, data = _straggler_gzip(tmp_path)
    bad = tmp_path / "run.jsonl.gz"
    bad.write_bytes(_corrupt_gzip(data, wanted, len(data) // 2))
    r = run_cli(capsys, "report", "--json", str(bad))
    assert r.exit_code == 2 and "internal error" not in r.err
    assert r.err.startswith(f"gpudoctor: recording {bad} is damaged") and len(r.err.splitlines()) == 1
    doc = json.loads(r.out)
    assert 0 < doc["samples"] < 300 and "kept the" in doc["damage"]
    # Damage in the very first block: nothing to keep, one line, still exit 2.
    bad.write_bytes(_corrupt_gzip(data, zlib.error, 20))
    r = run_cli(capsys, "report", str(bad))
    assert r.exit_code == 2 and r.err.startswith(f"gpudoctor: cannot read recording {bad}") and not r.out


def test_replaying_a_corrupt_gzip_plays_what_came_before_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`watch --replay` of the same file: the samples before the damage are played, its note names the
    damage, and the exit code says the input was bad (it was 0, as if the file were whole)."""
    plain, data = _straggler_gzip(tmp_path)
    bad = tmp_path / "run.jsonl.gz"
    bad.write_bytes(_corrupt_gzip(data, gzip.BadGzipFile, len(data) // 2))
    r = run_cli(capsys, "watch", "--replay", str(bad), "--no-tui", "--json", "--speed", "100000")
    assert r.exit_code == 2 and "internal error" not in r.err
    summary = json.loads(r.out.splitlines()[-1])
    assert 0 < summary["samples"] < 300 and "kept the" in summary["damage"]
    plain_r = run_cli(capsys, "watch", "--replay", str(plain), "--no-tui", "--json", "--speed", "100000")
    assert plain_r.exit_code == 0


def test_a_full_disk_at_the_start_leaves_no_empty_recording_and_keeps_the_old_one(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """Issue 24: the file was created before its header failed to write: a 0-byte recording (and
    with --force, the previous recording already replaced by it)."""
    path = tmp_path / "run.jsonl"
    args = ["watch", "--no-tui", "--duration", "1", "--record", str(path)]
    full = _file_size_limit(10)  # not even the header fits
    r = gpudoctor_cli(*args, env=FAKE, preexec_fn=full)  # noqa: PLW1509
    assert r.returncode == 3 and "cannot write recording" in r.stderr and "File too large" in r.stderr
    assert not path.exists() and list(tmp_path.iterdir()) == []  # no empty file, no temporary file
    old = (RECORDINGS / "healthy.jsonl").read_bytes()
    path.write_bytes(old)
    r = gpudoctor_cli(*args, "--force", env=FAKE, preexec_fn=full)  # noqa: PLW1509
    assert r.returncode == 3 and path.read_bytes() == old and list(tmp_path.iterdir()) == [path]


def test_a_number_too_long_for_python_is_a_damaged_line_said_in_our_words(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """json refuses an integer of more than 4,300 digits with Python's advice (sys.set_int_max_str_digits),
    which the note quoted cut mid-word (the review)."""
    doc = _line(6)
    doc["gpus"][0]["util"] = 7
    path = _edited(tmp_path, {6: json.dumps(doc).replace('"util": 7', '"util": 1' + "0" * 5000, 1)})
    r = gpudoctor_cli("report", str(path))
    assert r.returncode == 0 and "line 6 of" in r.stdout, r.stdout
    assert "(a number of more than 4300 digits); skipped it" in r.stdout and "set_int_max_str_digits" not in r.stdout


def test_a_step_of_a_few_subnormal_seconds_is_a_share_of_one_not_an_internal_error(
    tmp_path: Path, gpudoctor_cli: GpudoctorCli
) -> None:
    """The second review: a step time of 1e-320 s is in range, and the input-wait and loader shares (exact
    sums divided) overflowed a float: OverflowError, exit 3. A share is at most 1 whatever its parts."""
    lines = gzip.open(recording_path("sample:straggler"), "rt").read().splitlines()
    out = lines[:1]
    for line in lines[1:]:
        doc = json.loads(line)
        for rank in doc["ranks"]:
            rank.update(wait_s=1.0, wait_step_s=1e-320, step_s=1e-320)
        doc["data"] = [{"pid": r["pid"], "rank": r["rank"], "loader": {"s": 0.5, "batches": 1}} for r in doc["ranks"]]
        out.append(json.dumps(doc))
    path = tmp_path / "tiny.jsonl"
    path.write_text("\n".join(out) + "\n")
    for args in (("report", "--json", str(path)), ("watch", "--replay", str(path), "--no-tui", "--speed", "100000")):
        r = gpudoctor_cli(*args)
        assert r.returncode == 0 and "internal error" not in r.stderr, r.stderr
    doc = _strict_json(gpudoctor_cli("report", "--json", str(path)).stdout)
    assert {row["wait_share"] for row in doc["ranks"]} == {1.0}  # type: ignore[index]
