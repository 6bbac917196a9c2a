"""``smddp-bench render``: the tables of markdown files, from benchmark records.

A generated table sits between two markers; the first names the record,
relative to the markdown file:

    <!-- smddp-bench:table results/bench-2x2.json -->
    (generated: the table, what it shows, the timing policy, the machine and
    the command that produced the record)
    <!-- /smddp-bench:table -->

``render FILE...`` rewrites those sections from the records; ``--check``
rewrites nothing and exits 1 when a section differs from what its record
gives (a table typed or edited by hand, or a record changed since). Torch-free.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from smddp.bench import links, record, views

MARKER = re.compile(
    r"(<!-- smddp-bench:table (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /smddp-bench:table -->)",
    re.S,
)


def render(text: str, base: str) -> str:
    """``text`` with every marked section generated from its record (paths
    relative to ``base``)."""

    def one(m: re.Match) -> str:
        path = os.path.join(base, m["path"])
        try:
            rec = record.read(path)
            return m.group(1) + views.markdown(rec, links.markdown_view(rec)) + "\n" + m.group(4)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    return MARKER.sub(one, text)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="smddp-bench render",
        description="Rewrite the generated tables of markdown files from the benchmark records "
        "they name (<!-- smddp-bench:table RECORD.json --> ... <!-- /smddp-bench:table -->).",
    )
    p.add_argument("files", nargs="+", help="markdown files")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a generated table is not what its record gives")
    ns = p.parse_args(argv)
    stale = 0
    for path in ns.files:
        with open(path) as f:
            old = f.read()
        try:
            new = render(old, os.path.dirname(os.path.abspath(path)))
        except (OSError, ValueError, KeyError) as e:
            print(f"smddp-bench render: {path}: {e}", file=sys.stderr)
            return 2
        sections = len(MARKER.findall(old))
        if new == old:
            print(f"{path}: {sections} generated tables, up to date")
        elif ns.check:
            stale += 1
            print(f"{path}: generated tables differ from their records; run: smddp-bench render "
                  f"{path}", file=sys.stderr)  # fmt: skip
        else:
            with open(path, "w") as f:
                f.write(new)
            print(f"{path}: {sections} generated tables rewritten")
    return 1 if stale else 0
