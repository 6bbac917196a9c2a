"""The docs' performance tables are generated from the records kept in the
repository (docs/results/), and are what those records give: a table typed
or edited by hand, or a record changed without rendering, fails here."""

from __future__ import annotations

import glob
import os
import re

from smddp.bench import record, render

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")


def _generated() -> list[str]:
    """The markdown files of the docs that hold generated tables."""
    files = sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    files.append(os.path.join(REPO, "README.md"))
    return [f for f in files if os.path.exists(f) and render.MARKER.search(open(f).read())]


def test_the_generated_tables_are_current(capsys):
    files = _generated()
    assert os.path.join(DOCS, "performance.md") in files
    assert render.main(["--check", *files]) == 0, capsys.readouterr().err


def test_no_performance_table_is_typed_by_hand():
    text = open(os.path.join(DOCS, "performance.md")).read()
    outside = render.MARKER.sub("", text)
    typed = [ln for ln in outside.splitlines() if ln.lstrip().startswith("|")]
    assert not typed, f"tables outside <!-- smddp-bench:table --> markers: {typed}"


def test_every_record_is_shown_and_names_its_machine_and_command():
    shown = {os.path.normpath(os.path.join(os.path.dirname(f), m["path"]))
             for f in _generated() for m in render.MARKER.finditer(open(f).read())}  # fmt: skip
    records = sorted(glob.glob(os.path.join(DOCS, "results", "*.json")))
    assert records and set(records) <= shown, set(records) - shown
    for path in records:
        rec = record.read(path)
        m = rec["machine"]
        for key in ("cpu_model", "cpu_cores", "kernel", "torch", "python"):
            assert m[key], (path, key)
        assert re.match(r"\d{4}-\d\d-\d\dT", rec["created"]), path
        # The command regenerates this very file.
        assert os.path.relpath(path, REPO) in " ".join(rec["command"]), (path, rec["command"])
