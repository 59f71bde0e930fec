"""``h3gate``: the engine's command line (models, variants, candidates, contract locking).

argparse, because it ships with Python and gives every subcommand its own ``--help``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _variants(args) -> int:
    from h3gate import numerics

    for mode in (numerics.GOLDEN, numerics.PROVIDER, *numerics.variants(args.device)):
        print(f"{mode.name:16s} {mode.description}")
    return 0


def _identity(args) -> int:
    from h3gate.model import load_model

    model = load_model(args.model, args.seed)
    print(f"{model.name} {model.identity} ({model.source})")
    return 0


def _candidates(args) -> int:
    from h3gate.candidates import available

    for name in sorted(available()):
        print(name)
    return 0


def _lock(args) -> int:
    from h3gate.bounds import lock_files

    thresholds = Path(args.thresholds).resolve()
    paths = [Path(p).resolve() for p in args.contracts]
    for path in paths:
        if not path.name.endswith("-contract.json"):
            print(f"h3gate lock: {path} is not a contract (*-contract.json); bounds are locked only by freezing them", file=sys.stderr)
            return 2
        if thresholds not in path.parents:
            print(f"h3gate lock: {path} is not under {thresholds}", file=sys.stderr)
            return 2
    lock_files(thresholds, paths)
    for path in paths:
        print(f"locked {path.relative_to(thresholds)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h3gate",
        description="Kernel qualification for the MiniMax-H3 transformer. The gates themselves run under pytest "
        "(pytest -m gate); this command inspects and maintains what they use.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    variants = commands.add_parser("variants", help="list the numerics modes (golden, provider, variants) of a device")
    variants.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    variants.set_defaults(run=_variants)

    identity = commands.add_parser("identity", help="print a model's identity digest")
    identity.add_argument("--model", default="tiny", help="tiny, small or a checkpoint folder (default: tiny)")
    identity.add_argument("--seed", type=int, default=0, help="weight seed of an embedded model (default: 0)")
    identity.set_defaults(run=_identity)

    candidates = commands.add_parser("candidates", help="list the registered candidates")
    candidates.set_defaults(run=_candidates)

    lock = commands.add_parser(
        "lock",
        help="record the digest of new or changed contract files in thresholds/LOCK.json (bounds are locked by "
        "freezing them, never by hand)",
    )
    lock.add_argument("contracts", nargs="+", help="contract files (*-contract.json) under the thresholds folder")
    lock.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    lock.set_defaults(run=_lock)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
