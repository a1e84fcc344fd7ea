"""How a job ended (gpudoctor/watch/crash.py, output.py): the first rank that failed and its error, read
from real output of failing torchrun and mp.spawn jobs (tests/fixtures/runtime_errors/README.md), passed
through the same stderr reader `watch` uses."""

from __future__ import annotations

import os
import threading

from gpudoctor.watch.arrival import RANK, JobProc
from gpudoctor.watch.crash import diagnose, explained, verdict
from gpudoctor.watch.output import MAX_LINES, StderrTail
from tests.paths import FIXTURES

LOGS = FIXTURES / "runtime_errors"


def tail_of(text: str) -> StderrTail:
    """`text` read through a pipe by the reader watch puts on a command's stderr (nothing passed on)."""
    r, w = os.pipe()
    tail = StderrTail(r, out_fd=None)
    writer = threading.Thread(target=lambda: (os.write(w, text.encode()), os.close(w)))
    writer.start()
    writer.join()
    tail.wait(5)
    return tail


def failure_of(name: str, procs: tuple[JobProc, ...] = (), error_file: str | None = None):  # type: ignore[no-untyped-def]
    tail = tail_of((LOGS / f"{name}.log").read_text(encoding="utf-8"))
    return diagnose(tail.text(), error_file, procs, tail.rank_text, 1)


def test_torchruns_root_cause_names_the_rank_not_the_ones_it_stopped() -> None:
    f = failure_of("rank1_crash")
    assert (f.source, f.rank, f.local_rank, f.exit_code, f.pid) == ("torchrun", 1, 1, 1, 25749)
    assert f.victims == (0,)  # SIGTERM from torchrun: listed under Failures, not the cause
    assert f.error == "RuntimeError: boom on rank 1" and f.known is None
    assert f.line == "rank 1 failed first (exit code 1): RuntimeError: boom on rank 1"


def test_without_record_the_cause_is_read_from_the_output_before_torchruns_summary() -> None:
    f = failure_of("rank1_crash_norecord")
    assert (f.rank, f.exit_code) == (1, 1)
    assert f.error == "RuntimeError: boom on rank 1"


def test_the_error_file_torchrun_writes_is_read_for_the_cause() -> None:
    doc = '{"message": {"message": "RuntimeError: CUDA error: invalid device ordinal", "extraInfo": {}}}'
    f = failure_of("rank1_crash_norecord", error_file=doc)
    assert f.known is not None and f.known.kind == "invalid_device"


def test_the_failing_ranks_own_prefixed_lines_are_classified_with_the_fix() -> None:
    f = failure_of("unused_param")
    assert f.source == "torchrun" and f.known is not None
    assert f.known.kind == "unused_parameters"
    assert f.known.detail == "parameter indices 2 3"
    assert f.known.line.startswith("RuntimeError: Expected to have finished reduction")
    v = verdict(f, ())
    assert v.code == "GD927" and "find_unused_parameters=True" in v.hint
    assert v.ranks and v.ranks[0].rank == f.rank


def test_a_cpp_abort_at_exit_is_read_from_the_unprefixed_output() -> None:
    """torch's gloo exit abort (both ranks SIGABRT; reproduced, gloo_exit_abort.py): the only text is
    libstdc++'s line, which C++ writes to the rank's stderr outside torch's `[rankN]:` prefix."""
    f = failure_of("gloo_exit_abort")
    assert (f.source, f.rank, f.exit_code, f.signal) == ("torchrun", 0, -6, "SIGABRT")
    assert f.known is not None and f.known.kind == "cpp_abort"
    assert f.line == "rank 0 failed first (killed by SIGABRT): the process aborted in C++ (std::terminate)"
    assert "destroy_process_group()" in f.known.fix and "os._exit(0)" in f.known.fix


def sigabrt_of(replacement: str):  # type: ignore[no-untyped-def]
    """The gloo_exit_abort log (rank 0 the root cause, SIGABRT) with its two libstdc++ lines replaced."""
    text = (LOGS / "gloo_exit_abort.log").read_text(encoding="utf-8")
    line = "terminate called without an active exception"
    tail = tail_of(text.replace(f"{line}\n{line}", replacement))
    return diagnose(tail.text(), None, (), tail.rank_text, 1)


def test_another_ranks_error_is_not_pinned_on_the_aborted_rank() -> None:
    """Lines torch prefixed with another rank's `[rankN]:` are that rank's: not read for rank 0's abort."""
    f = sigabrt_of("[rank1]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert f is not None and f.rank == 0 and f.known is None


def test_a_watchdog_abort_is_named_as_its_timeout_not_as_a_bare_abort() -> None:
    """NCCL's watchdog ends a rank with std::terminate after throwing its timeout (unprefixed, C++), next to
    the rank's own prefixed warnings and another rank's bare exit abort: the specific cause wins."""
    f = sigabrt_of(
        "[rank0]:[W1127 ProcessGroupNCCL.cpp:1] a warning\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "  what():  [PG 0 Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
        "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
        "terminate called without an active exception"
    )
    assert f is not None and f.known is not None and f.known.kind == "timeout"
    assert "WorkNCCL(SeqNum=5, OpType=ALLREDUCE)" in f.known.detail


def test_nccls_duplicate_gpu_is_named_from_an_h200_run() -> None:
    f = failure_of("gpu_dup")
    assert f.rank == 0 and f.known is not None and f.known.kind == "duplicate_gpu"
    assert "set_device(local_rank)" in f.known.fix


def test_a_peer_lost_after_another_rank_finished_its_loop_says_uneven_steps() -> None:
    procs = (
        JobProc(100, RANK, 1.0, rank=0, step=3, inside=False, ended=5.0, exit="normal"),
        JobProc(101, RANK, 1.0, rank=1, step=4, inside=False, ended=6.0, exit="exception"),
    )
    f = explained(failure_of("uneven_inputs", procs), procs)
    assert f.rank == 1 and f.known is not None and f.known.kind == "peer_lost" and f.known.victim
    assert f.note == "rank 0 had ended its loop after step 3 (uneven steps, GD926)"
    assert f.line.endswith("(uneven steps, GD926)")


def test_mp_spawn_names_the_process_index() -> None:
    f = failure_of("spawn_child_error")
    assert (f.source, f.rank) == ("mp.spawn", 1)
    assert f.error == "RuntimeError: boom in spawned process 1"
    assert f.who == "process 1 of mp.spawn"


def test_the_reader_keeps_each_ranks_lines_and_a_bounded_tail() -> None:
    text = "".join(f"[rank{i % 3}]: line {i}\n" for i in range(3 * MAX_LINES)) + "no newline at the end"
    tail = tail_of(text)
    assert tail.text().splitlines()[-1] == "no newline at the end"
    assert len(tail.text().splitlines()) == MAX_LINES
    ones = tail.rank_text(1).splitlines()
    assert len(ones) == MAX_LINES and ones[-1] == f"line {3 * MAX_LINES - 2}"
    assert tail.rank_text(7) == ""


def test_the_reader_passes_the_bytes_on_unchanged() -> None:
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    tail = StderrTail(r, out_fd=out_w)
    data = b"\x1b[31mred\x1b[0m \xff not utf-8\n" * 100
    os.write(w, data)
    os.close(w)
    tail.wait(5)
    os.close(out_w)
    got = b""
    while chunk := os.read(out_r, 65536):
        got += chunk
    os.close(out_r)
    assert got == data
    assert "\ufffd not utf-8" in tail.text()


def test_what_a_rank_printed_is_redacted_and_one_line_before_it_is_shown() -> None:
    text = "RuntimeError: Address already in use: HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 \x1b[2J\n"
    f = diagnose(text, None, (), lambda _: "", 1)
    assert f is not None and f.known is not None and f.known.kind == "port_in_use"
    assert "hf_abcdefghijklmnop" not in f.line + f.error + f.known.line
    assert "\x1b" not in f.error + f.known.line
