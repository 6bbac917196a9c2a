"""The docs' performance tables are generated from the records kept in the
repository (docs/results/), and are what those records give: a table typed
or edited by hand, or a record changed without rendering, fails here. And
every relative link of the docs leads somewhere: a file that exists, a
heading that exists."""

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
    for name in ("README.md", "docs/performance.md", "docs/training.md"):
        assert os.path.join(REPO, name) in files, f"{name} shows no generated table"
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
        if m.get("gpus"):
            # Measured by tools/gpu_check.py on a GPU machine, which
            # writes to its $OUT (docs/cuda.md says so): the command names
            # the repository's benchmark that made it.
            assert rec["command"][0] == "smddp-bench" or any(
                os.path.isfile(os.path.join(REPO, a)) for a in rec["command"]), (path, rec["command"])  # fmt: skip
            continue
        # The command regenerates this very file.
        assert os.path.relpath(path, REPO) in " ".join(rec["command"]), (path, rec["command"])


# -- links ----------------------------------------------------------------------

# The markdown a reader starts from: the README, docs/, and the READMEs of the
# folders they send the reader to.
LINKED = ["README.md", "bench/README.md", "examples/README.md"] + sorted(
    os.path.relpath(f, REPO) for f in glob.glob(os.path.join(DOCS, "*.md"))
)
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _outside_code(text: str) -> list[str]:
    """The lines of a markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """The fragments GitHub gives the headings of a markdown text: lower case,
    punctuation dropped, spaces as hyphens, -1, -2 ... on repeats."""
    count: dict[str, int] = {}
    out = set()
    for line in _outside_code(text):
        m = re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m[1].lower()).replace(" ", "-")
            out.add(f"{slug}-{count[slug]}" if slug in count else slug)
            count[slug] = count.get(slug, 0) + 1
    return out


def links(path: str) -> list[str]:
    """The relative link targets of a markdown file (no URLs, no mail)."""
    found = []
    for line in _outside_code(open(path).read()):
        prose = re.sub(r"`[^`]*`", "", line)  # a link in inline code is an example
        found += [t for t in _LINK.findall(prose) if not re.match(r"[a-z]+:", t)]
    return found


def test_anchors_are_githubs():
    text = "# smddp\n## Cost model (`smddp-bench model`)\n```\n# not a heading\n```\n## Results\n## Results\n"
    assert anchors(text) == {"smddp", "cost-model-smddp-bench-model", "results", "results-1"}


def test_every_relative_link_resolves():
    broken = []
    for name in LINKED:
        source = os.path.join(REPO, name)
        for target in links(source):
            file, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(source), file)) if file else source
            if not os.path.exists(dest):
                broken.append(f"{name}: {target}: no such file")
            elif fragment and dest.endswith(".md") and fragment not in anchors(open(dest).read()):
                broken.append(f"{name}: {target}: no heading #{fragment} in {os.path.relpath(dest, REPO)}")
    assert not broken, "\n".join(broken)
