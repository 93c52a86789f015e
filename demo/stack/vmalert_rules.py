"""The committed rules as the packaged vmalert accepts them (docs/scale.md):

    .venv/bin/python -m fabricscope.demo.stack.vmalert_rules --out /etc/vmalert/rules
"""
from __future__ import annotations

from pathlib import Path

from .errors import StackError
from .victoria import vmalert_rules


def main(argv: list[str] | None = None) -> int:
    """`python -m fabricscope.demo.stack.vmalert_rules --out DIR [RULE_FILE...]`: the rule files
    (by default the committed rules/*.yaml) as vmalert accepts them, for a production vmalert."""
    import argparse
    import sys

    from fabricscope.rules import rule_files

    parser = argparse.ArgumentParser(description=main.__doc__.split(":", 1)[1].strip())
    parser.add_argument("--out", type=Path, required=True, help="directory for the vmalert rule files")
    parser.add_argument("rules", nargs="*", type=Path, help="rendered rule files (default: rules/*.yaml)")
    args = parser.parse_args(argv)
    try:
        written, dropped = vmalert_rules(args.rules or rule_files(), args.out)
    except StackError as exc:
        print(f"fabricscope.demo.stack.vmalert_rules: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    for what in dropped:
        print(f"dropped (vmalert 1.79 lacks it): {what}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
