"""``aithermd schema``: print the JSON Schema (draft 2020-12) of policy files on stdout, for editors
(e.g. yaml-language-server: ``# yaml-language-server: $schema=policy.schema.json``). Exit status 0."""

from __future__ import annotations

import argparse
import json

HELP = "print the JSON Schema of policy files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compact", action="store_true", help="one line instead of indented")
    parser.add_argument("--markdown", action="store_true", help="the reference as Markdown")


def run(args: argparse.Namespace) -> int:
    from aithermd.policy.schema import json_schema
    if args.markdown:
        from aithermd.policy.schemadoc import markdown
        print(markdown(json_schema()), end="")
        return 0
    print(json.dumps(json_schema(), indent=None if args.compact else 2, ensure_ascii=False))
    return 0
