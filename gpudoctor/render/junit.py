"""JUnit XML: one testsuite per check that has findings, one testcase per finding, for CI dashboards.

Mapping (docs/gates.md): `fail` -> <failure>; `error` (the check crashed) -> <error>; `skip` ->
<skipped>; `warn` -> <failure type="warn"> under --fail-on warn, otherwise a passing test case
whose <system-out> starts with "warning:"; `pass` -> a passing test case. Test case names are
"<code> <subject>", made unique within their suite with " #2", " #3"... in report order:
GitLab keeps only the first of two test cases with the same name.

Text from a snapshot (a GPU name, a host name, a process's command line) can hold characters
XML 1.0 cannot carry at all, escaped or not: control characters and lone surrogates. They
become U+FFFD, so the file always parses (ElementTree would write them as they are).
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gpudoctor.findings import Report, Status
from gpudoctor.safety.safe_io import write_text

# Outside XML 1.0's Char production (https://www.w3.org/TR/xml/#charsets).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def _clean(element: ET.Element) -> None:
    for el in element.iter():
        el.attrib = {k: xml_safe(v) for k, v in el.attrib.items()}
        if el.text:
            el.text = xml_safe(el.text)


def junit_tree(report: Report) -> ET.ElementTree:
    suites = ET.Element("testsuites", name="gpudoctor", tests=str(len(report.findings)))
    for result in report.checks:
        if not result.findings:  # a check with nothing to say is no test: an empty suite reads as a broken one
            continue
        failures = sum(
            1
            for f in result.findings
            if f.status in (Status.FAIL, Status.WARN) and f.status.rank >= report.fail_on.rank
        )
        errors = sum(1 for f in result.findings if f.status == Status.ERROR)
        skipped = sum(1 for f in result.findings if f.status == Status.SKIP)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=result.name,
            tests=str(len(result.findings)),
            failures=str(failures),
            errors=str(errors),
            skipped=str(skipped),
            time=f"{result.duration_s:.3f}",
        )
        seen: dict[str, int] = {}
        for f in result.findings:
            name = f"{f.code} {f.subject}"
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:
                name = f"{name} #{seen[name]}"
            case = ET.SubElement(suite, "testcase", classname=f"gpudoctor.{result.name}", name=name)
            body = f"{f.message}\nhint: {f.hint}" if f.hint else f.message
            if f.status == Status.ERROR:
                ET.SubElement(case, "error", message=f.message).text = body
            elif f.status == Status.SKIP:
                ET.SubElement(case, "skipped", message=f.message)
            elif f.status.rank >= report.fail_on.rank and f.status != Status.PASS:
                ET.SubElement(case, "failure", message=f.message, type=f.status.value).text = body
            elif f.status == Status.WARN:
                ET.SubElement(case, "system-out").text = f"warning: {body}"
    _clean(suites)
    return ET.ElementTree(suites)


def write_junit(report: Report, path: str | Path) -> None:
    tree = junit_tree(report)
    ET.indent(tree)
    buf = io.BytesIO()
    tree.write(buf, encoding="utf-8", xml_declaration=True)
    write_text(path, buf.getvalue().decode("utf-8"))
