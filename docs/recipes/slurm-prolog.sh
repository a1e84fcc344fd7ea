#!/bin/bash
# gpudoctor as a Slurm prolog: drain a node whose GPUs are not fit, with the failing codes as reason.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/gpudoctor.sh     (PrologFlags=Alloc runs it at allocation)
#
# Exit status (Slurm's rule): non-zero drains the node and requeues the job (held unless
# SchedulerParameters=nohold_on_prolog_fail). This script drains first with its own reason, so
# `sinfo -R` says which check failed; slurmctld keeps a reason already set. Only findings
# (gpudoctor exit 1) or a hang (timeout) drain: gpudoctor failing to run at all (exit 2/3, a
# broken install) is logged and the job goes on, so one bad upgrade cannot drain the fleet.
#
# Settings (environment, or edit here):
#   GPUDOCTOR             the gpudoctor executable            (default: found on PATH)
#   GPUDOCTOR_ARGS        extra options, e.g. "--config /etc/gpudoctor.toml --expect-gpus 8"
#   GPUDOCTOR_LOG_DIR     where the last report is kept        (default: /var/log/gpudoctor)
#   GPUDOCTOR_TIMEOUT     seconds before the check counts as hung (default: 60)

set -u
# Slurm runs prologs without a search path (prolog_epilog.html): give one, after any inherited.
export PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

node="${SLURMD_NODENAME:-$(hostname -s)}"
job="${SLURM_JOB_ID:-none}"
log_dir="${GPUDOCTOR_LOG_DIR:-/var/log/gpudoctor}"
report="$log_dir/prolog-$node.json"
if ! install -d -m 0750 "$log_dir" 2>/dev/null; then
  report=$(mktemp) || exit 0  # no log directory: check all the same, keep the report in /tmp
fi

# --quick: static checks only (well under a second); a prolog must finish quickly.
# shellcheck disable=SC2086  # GPUDOCTOR_ARGS is a list of options
timeout "${GPUDOCTOR_TIMEOUT:-60}" "${GPUDOCTOR:-gpudoctor}" check --quick --json --no-github ${GPUDOCTOR_ARGS:-} >"$report" 2>"$report.err"
status=$?

case "$status" in
  0) exit 0 ;;
  1) codes=$(python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
bad = sorted({f["code"] for c in doc["checks"] for f in c["findings"] if f["status"] in ("fail", "error")})
print(" ".join(bad[:8]) + (" ..." if len(bad) > 8 else ""))
' "$report" 2>/dev/null)
     reason="gpudoctor: ${codes:-findings} (job $job, $report)" ;;
  124) reason="gpudoctor: check hung for ${GPUDOCTOR_TIMEOUT:-60} s, NVML not answering? (job $job)" ;;
  *) echo "gpudoctor prolog: gpudoctor could not run (exit $status), node left in service: $(head -c 300 "$report.err")" >&2
     exit 0 ;;
esac

scontrol update nodename="$node" state=drain reason="$reason"
echo "gpudoctor prolog: drained $node: $reason" >&2
exit 1
