"""Write ``docs/index.md``, the documentation site's front page, from ``README.md``: the same
text with the links into ``docs/`` made relative to it, so that the two front pages never
differ (``tests/test_docs.py`` checks that the committed page is this script's output).

    python scripts/docs_index.py          # rewrite docs/index.md
    python scripts/docs_index.py --check  # exit 1 when docs/index.md is out of date
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("<!-- Generated from README.md by scripts/docs_index.py: edit README.md, then run "
          "the script. -->\n\n")


def site_index(readme: str) -> str:
    """``README.md``'s text as the site's ``index.md``: ``](docs/x)`` links become ``](x)``."""
    return HEADER + re.sub(r"\]\(docs/", "](", readme)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that docs/index.md is up to date")
    args = parser.parse_args(argv)
    wanted = site_index((ROOT / "README.md").read_text())
    index = ROOT / "docs" / "index.md"
    if args.check:
        if index.read_text() != wanted:
            print("docs_index: docs/index.md differs from README.md; run python "
                  "scripts/docs_index.py", file=sys.stderr)
            return 1
        return 0
    index.write_text(wanted)
    print(f"wrote {index.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
