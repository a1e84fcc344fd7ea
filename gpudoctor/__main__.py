"""`python -m gpudoctor` and the `gpudoctor` command.

The stop signals are taken over before anything else is imported, so a SIGTERM or SIGHUP that
arrives while gpudoctor starts up ends it like one that arrives later: one line, the JSON error
document under --json, exit 130 or 129.
"""

from __future__ import annotations

import sys


def main() -> None:
    from gpudoctor.safety import signals

    signals.install()
    try:
        from gpudoctor.cli.main import run
    except KeyboardInterrupt as exc:  # stopped while importing: cli's own handling is not loaded yet
        from gpudoctor.errors import error_document, wants_json

        argv = sys.argv[1:]
        if wants_json(argv):
            sys.stdout.write(error_document(argv, "interrupted", signals.describe(exc), signals.exit_code(exc)))
        sys.stderr.write(f"gpudoctor: {signals.describe(exc)}\n")
        sys.exit(signals.exit_code(exc))
    run()


if __name__ == "__main__":
    main()
