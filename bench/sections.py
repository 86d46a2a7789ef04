"""Sections of bench/RESULTS.md written by the benchmarks beside bench/run.sh
(bench/waitlist.py, bench/catalogue.py): each between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`, replaced as a whole when its
benchmark runs again, and carried over when bench/run.sh rewrites the rest.

    python3 bench/sections.py carry OLD_RESULTS   # prints OLD's sections
"""

from __future__ import annotations

import re
import sys

SECTION = re.compile(r"<!-- (?P<name>[a-z-]+):begin -->\n.*?<!-- (?P=name):end -->\n", re.S)


def sections(text: str) -> list[str]:
    return [m.group(0) for m in SECTION.finditer(text)]


def replace(path: str, name: str, body: str) -> None:
    """Puts `body` as section `name` of the file at `path`, in place of the
    one there, else at its end."""
    block = f"<!-- {name}:begin -->\n{body.rstrip()}\n<!-- {name}:end -->\n"
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    pattern = re.compile(rf"<!-- {name}:begin -->\n.*?<!-- {name}:end -->\n", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "carry":
        sys.exit(__doc__)
    try:
        with open(sys.argv[2]) as f:
            found = sections(f.read())
    except FileNotFoundError:
        found = []
    for block in found:
        sys.stdout.write("\n" + block)
