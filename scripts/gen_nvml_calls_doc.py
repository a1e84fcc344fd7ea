"""Write docs/nvml-calls.md from gpudoctor/probe/nvml_calls.py (the table beside the probe).

python scripts/gen_nvml_calls_doc.py           write it
python scripts/gen_nvml_calls_doc.py --check   write nothing; exit 1 if it is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpudoctor.probe.nvml_calls import markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "nvml-calls.md"


def main(argv: list[str]) -> int:
    text = markdown()
    if "--check" in argv:
        stale = not DOC.is_file() or DOC.read_text(encoding="utf-8") != text
        if stale:
            print(f"{DOC} is stale: run python scripts/gen_nvml_calls_doc.py", file=sys.stderr)
        return 1 if stale else 0
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
