"""``h3gate``: the engine's command line (models, variants, candidates, contract locking, evidence).

argparse, because it ships with Python and gives every subcommand its own ``--help``.
"""

from __future__ import annotations

import argparse

from h3gate.cli import evidence, inspect, prepare, runs
from h3gate.cli.common import Refused, refuse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h3gate",
        description="Kernel qualification for the MiniMax-H3 transformer. The gates themselves run under pytest "
        "(pytest -m gate); this command inspects and maintains what they use.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (inspect, prepare, runs, evidence):
        group.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    from h3gate import quiet

    quiet.install()
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Refused as refusal:
        return refuse(" ".join(filter(None, (args.command, getattr(args, "checkpoint_command", None)))), refusal.code,
                      refusal.reason)


