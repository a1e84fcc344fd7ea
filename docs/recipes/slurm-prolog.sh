#!/bin/bash
# gpudoctor as a Slurm prolog: drain a node whose GPUs are not fit, with the failing codes as reason.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/gpudoctor.sh     (PrologFlags=Alloc runs it at allocation)
#
# Exit status (Slurm's rule): non-zero drains the node and requeues the job (held unless
# SchedulerParameters=nohold_on_prolog_fail). This script drains first with its own reason, so
# `sinfo -R` says which check failed; slurmctld keeps a reason already set. Only failing findings
# (gpudoctor exit 1 with a `fail`) or a hang (timeout) drain. gpudoctor failing to run at all
# (exit 2/3, a broken install) and `error` findings alone (a check of gpudoctor's that crashed,
# not something wrong with the node) are logged and the job goes on, so one bad upgrade cannot
# drain the fleet.
#
# Settings (environment, or edit here):
#   GPUDOCTOR             the gpudoctor executable            (default: found on PATH)
#   GPUDOCTOR_CONFIG      the policy file (default: /etc/gpudoctor.toml when it exists, else none;
#                         never one found around slurmd's working directory)
#   GPUDOCTOR_ARGS        extra options, e.g. "--expect-gpus 8"
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

# The policy is named, never discovered: a gpudoctor.toml another user left above slurmd's working
# directory must not decide whether this node runs jobs.
config="${GPUDOCTOR_CONFIG:-/etc/gpudoctor.toml}"
if [ -n "${GPUDOCTOR_CONFIG:-}" ] || [ -f "$config" ]; then
  policy=(--config "$config")
else
  policy=(--no-config)
fi

# --quick: static checks only (well under a second); a prolog must finish quickly.
# shellcheck disable=SC2086  # GPUDOCTOR_ARGS is a list of options
timeout "${GPUDOCTOR_TIMEOUT:-60}" "${GPUDOCTOR:-gpudoctor}" check --quick --json --no-github "${policy[@]}" \
  ${GPUDOCTOR_ARGS:-} >"$report" 2>"$report.err"
status=$?

case "$status" in
  0) exit 0 ;;
  1) # "fail" findings drain; "error" findings alone are gpudoctor's own crashes: logged, not drained.
     codes=$(python3 -c '
import json, sys
doc = json.load(open(sys.argv[1]))
found = [f for c in doc["checks"] for f in c["findings"]]
bad = sorted({f["code"] for f in found if f["status"] == "fail"})
crashed = sorted({f["code"] for f in found if f["status"] == "error"})
print(" ".join(bad[:8]) + (" ..." if len(bad) > 8 else "") if bad else "error: " + " ".join(crashed[:8]))
' "$report" 2>/dev/null)
     case "$codes" in
       "error: "*) echo "gpudoctor prolog: a gpudoctor check crashed (${codes#error: }), node left in service: $report" >&2
                   exit 0 ;;
     esac
     reason="gpudoctor: ${codes:-findings} (job $job, $report)" ;;
  124) reason="gpudoctor: check hung for ${GPUDOCTOR_TIMEOUT:-60} s, NVML not answering? (job $job)" ;;
  *) echo "gpudoctor prolog: gpudoctor could not run (exit $status), node left in service: $(head -c 300 "$report.err")" >&2
     exit 0 ;;
esac

scontrol update nodename="$node" state=drain reason="$reason"
echo "gpudoctor prolog: drained $node: $reason" >&2
exit 1
