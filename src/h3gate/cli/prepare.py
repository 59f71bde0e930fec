"""``h3gate init``, ``checkpoint make``, ``contracts``, ``lock``, ``capture``, ``status``: the repository set up, and what
the gates read, made, locked and checked before they run."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from h3gate.cli.common import free_folder, refuse
from h3gate.suite import DEFAULT_FILE as DEFAULT_SUITE


def _capture(args) -> int:
    from h3gate.bounds import BoundsError
    from h3gate.gates import block
    from h3gate.model.factory import ModelError, load_model

    path = Path(args.capture)
    if not path.name.endswith(block.CAPTURE_SUFFIX):
        print(f"h3gate capture: {path} is not a block capture (block<N>{block.CAPTURE_SUFFIX})", file=sys.stderr)
        return 2
    bounds = path.with_name(path.name.removesuffix(block.CAPTURE_SUFFIX) + "-bounds.json")
    if not bounds.is_file():
        return refuse("capture", 2, f"{path} has no {bounds.name} beside it: give the capture's path under "
                       "thresholds/<model>/<device class>/, where its block's bounds were frozen")
    device = args.device or ("cpu" if path.parent.name == "cpu" else "cuda")
    try:
        model = load_model(args.model or path.parent.parent.name)
    except ModelError as error:
        named = "" if args.model else " (as --model; the default is the thresholds folder's name)"
        return refuse("capture", 2, f"{error}{named}")
    try:
        written = block.recapture(path, model, device)
    except BoundsError as error:
        return refuse("capture", 1, str(error))
    print(f"captured {written}: bitwise the frozen capture")
    return 0


def _lock(args) -> int:
    from h3gate.bounds import lock_files
    from h3gate.files import FileFormatError
    from h3gate.generation import contract as generation_contract
    from h3gate.model import contract

    thresholds = Path(args.thresholds).resolve()
    paths = [Path(p).resolve() for p in args.contracts]
    for path in paths:
        if not path.name.endswith("-contract.json"):
            print(f"h3gate lock: {path} is not a contract (*-contract.json); bounds are locked only by freezing them", file=sys.stderr)
            return 2
        if thresholds not in path.parents:
            print(f"h3gate lock: {path} is not under {thresholds}", file=sys.stderr)
            return 2
    try:
        for path in paths:  # a contract its gate cannot read is never locked
            if path.name == "model-contract.json":
                contract.load_model_contract(path)
            else:
                generation_contract.load(path)
        lock_files(thresholds, paths)
    except (FileFormatError, OSError) as error:
        return refuse("lock", 2, str(error))
    for path in paths:
        print(f"locked {path.relative_to(thresholds)}")
    return 0


def _status(args) -> int:
    from h3gate.status import status

    try:
        report = status(args.thresholds, args.model, args.device)
    except ValueError as error:
        return refuse("status", 2, str(error))
    print(report.table())
    return 0 if report.ok else 1


STATUS_CODES = """exit codes:
  0  every file is present and locked
  1  a file is missing or stale (each such row says the command that makes it)
  2  usage: bad arguments, an unknown model"""


def _checkpoint_make(args) -> int:
    from h3gate.model.checkpoint import CheckpointError
    from h3gate.model.checkpoint_writer import make

    problem = free_folder(Path(args.folder).parent)
    if problem:
        return refuse("checkpoint make", 2, f"DIR {args.folder}: {problem}")
    components = args.components.split(",") if args.components else None
    try:
        folder = make(args.preset, args.folder, components, args.seed, args.max_shard_size, progress=sys.stderr,
                      layers=args.layers)
    except CheckpointError as error:
        return refuse("checkpoint make", 2, str(error))
    what = f"the {args.preset} preset" + (f"'s first {args.layers} blocks" if args.layers else "")
    print(f"wrote {folder}: {what} as a MiniMax-H3 checkpoint folder (--h3-model={folder})")
    print(f"next, write and lock its contracts: h3gate contracts --model={shlex.quote(str(folder))}")
    return 0


def _contracts(args) -> int:
    from h3gate.bounds import BoundsError
    from h3gate.generation import default_contracts

    problem = free_folder(Path(args.thresholds))
    if problem:
        return refuse("contracts", 2, f"--thresholds {args.thresholds}: {problem}")
    try:
        canvas = default_contracts.parse_canvas(args.canvas) if args.canvas else None
        paths = default_contracts.write(args.model, args.thresholds, args.replace, canvas)
    except (BoundsError, ValueError, OSError) as error:
        return refuse("contracts", 2, str(error))
    for path in paths:
        print(f"wrote and locked {path}" + (f" (replaced: {args.replace})" if args.replace else ""))
    _print_next_after_contracts(args.model, args.device, args.thresholds)
    return 0


def _print_next_after_contracts(model: str, device: str | None, thresholds: str) -> None:
    """The freeze commands of the contracts just written, then the command that checks a candidate: each names the
    repository's own gate suite (:mod:`h3gate.suite`)."""
    from h3gate import status, suite

    shown = None if thresholds == status.DEFAULT_THRESHOLDS else thresholds
    device = device or status.default_device(model)
    print(_cost(model, thresholds))
    print("next, freeze the bounds (cheap gates first):")
    for command in _freeze_commands(model, device, shown):
        print(f"  {command}")
    print("then check a candidate (--h3-candidate, default h3_triton) with the gates that read them:")
    print(f"  {status.check_command(suite.recorded(thresholds), model, device, shown)}")


def _cost(model: str, thresholds: str) -> str:
    """What the model contract costs, said before the first freeze: its rows and one forward and backward's FLOPs,
    and how many such passes the model gate makes (a canvas too large for the machine shows here, not an hour in)."""
    from h3gate.model.contract import load_model_contract, packed_rows, pass_flops
    from h3gate.model.spec import model_name, transformer_config

    contract = load_model_contract(Path(thresholds) / model_name(model) / "model-contract.json")
    config = transformer_config(model)
    rows = packed_rows(contract, config)
    return (f"the model contract packs {sum(rows.values()):,} rows a sample (text {rows['text']:,}, audio "
            f"{rows['audio']:,}, video {rows['video']:,}); a forward and backward of this transformer there is about "
            f"{_rounded(pass_flops(contract, config) / 1e12)} TFLOP, and the model gate makes 4 such passes to check a "
            "candidate, 2 and one a provider variant to freeze (--canvas FxHxW sets a smaller canvas)")


def _rounded(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _freeze_commands(spec: str, device: str, thresholds: str | None) -> list[str]:
    """The commands that freeze every gate's bounds for the written contracts, cheap gates first, each naming the
    test of the repository's gate suite (:mod:`h3gate.suite`) that freezes them."""
    from h3gate.gates import REGISTRY
    from h3gate.commands import freeze_command
    from h3gate.status import DEFAULT_THRESHOLDS
    from h3gate.suite import recorded, targets

    suite = recorded(thresholds or DEFAULT_THRESHOLDS)
    # One command a test function (every block's item at once), in the registry's order: cheap gates first; without
    # a suite, one command for every gate test.
    items = [frozen.item.partition("[")[0] for gate in REGISTRY.values() for frozen in gate.frozen if frozen.item]
    return list(dict.fromkeys(freeze_command(targets(suite, item), spec, device, thresholds) for item in items))


def _init(args) -> int:
    """Set the repository in the current folder up: gate suite, pytest.ini, thresholds folder; with --model its
    contracts too. Every refusal comes before the first file is written."""
    from h3gate import repository
    from h3gate.bounds import BoundsError
    from h3gate.generation import default_contracts

    root, thresholds = Path.cwd(), Path(args.thresholds)
    problem = free_folder(thresholds)
    if problem:
        return refuse("init", 2, f"--thresholds {args.thresholds}: {problem}")
    try:
        written = repository.plan(root, args.suite, thresholds, args.force)
        contracts = default_contracts.paths(args.model, thresholds) if args.model else []
    except (repository.SetupError, ValueError) as error:
        return refuse("init", 2, str(error))
    existing = [path for path in contracts if path.exists()]
    if existing and not args.force:
        return refuse("init", 2, f"{existing[0]} exists: init overwrites no contract (bounds were frozen for it); "
                      "pass --force to write the defaults anyway")
    try:
        paths = repository.write(thresholds, written)
    except OSError as error:
        return refuse("init", 2, str(error))
    for path, what in paths.items():
        print(f"wrote {path.relative_to(root) if path.is_absolute() else path}: {what}")
    for note in written.notes:
        print(f"note: {note}")
    if not args.model:
        print("next, a checkpoint folder to qualify (yours, or a test-sized one) and its contracts:")
        print("  h3gate checkpoint make --preset tiny checkpoint")
        print("  h3gate contracts --model=checkpoint")
        return 0
    try:
        for path in default_contracts.write(args.model, thresholds, "h3gate init --force" if args.force else None):
            print(f"wrote and locked {path}")
    except (BoundsError, ValueError, OSError) as error:
        return refuse("init", 2, str(error))
    _print_next_after_contracts(args.model, args.device, args.thresholds)
    return 0


def add_commands(commands) -> None:
    capture = commands.add_parser(
        "capture",
        help="make a block gate's frozen capture again where it is missing (kept only if bitwise the frozen one)",
        description="A block gate replays from block<N>-capture.safetensors frozen beside its bounds. A release-size "
        "capture may live outside version control; this makes it again from the model and the model contract and "
        "writes it only if its sha256 equals the one its bounds were frozen with (exit 1 otherwise: a machine of "
        "another CPU or GPU kind captures other bits; copy the file from where the bounds were frozen).",
    )
    capture.add_argument("capture", metavar="CAPTURE", help="thresholds/<model>/<device class>/block<N>-capture.safetensors")
    capture.add_argument("--model", default=None, help="tiny, edge, small or the checkpoint folder (default: the thresholds "
                         "folder's model name)")
    capture.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: from the device class folder)")
    capture.set_defaults(run=_capture)

    lock = commands.add_parser(
        "lock",
        help="record the digest of new or changed contract files in thresholds/LOCK.json (bounds are locked by "
        "freezing them, never by hand)",
    )
    lock.add_argument("contracts", nargs="+", help="contract files (*-contract.json) under the thresholds folder")
    lock.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    lock.set_defaults(run=_lock)

    status = commands.add_parser(
        "status",
        help="the frozen files (contracts, bounds, block captures) a model's gates need on this device: present and "
        "locked, missing or stale",
        description="Lists, per gate, every file under the thresholds folder that the gates of the model read on the "
        "device's class: 'present and locked' (its sha256 is its LOCK.json entry), 'missing' (with the command that "
        "freezes it) or 'stale' (its sha256 differs from LOCK.json, or it is not in it).",
        epilog=STATUS_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--model", "--h3-model", dest="model", default="tiny",
                        help="tiny (default), edge, small or a checkpoint folder")
    status.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible)")
    status.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    status.set_defaults(run=_status)

    checkpoint = commands.add_parser("checkpoint", help="checkpoint folders in the published MiniMax-H3 layout")
    checkpoint_commands = checkpoint.add_subparsers(dest="checkpoint_command", required=True)
    checkpoint_make = checkpoint_commands.add_parser(
        "make",
        help="write a preset as a diffusers MiniMax-H3 pipeline folder (model_index.json and every component)",
    )
    checkpoint_make.add_argument("folder", metavar="DIR", help="the folder to create (it must not exist)")
    checkpoint_make.add_argument(
        "--preset", required=True,
        help="the preset to write: tiny, edge, small (seconds) or release (the published configs with random weights: "
        "194.5 GB for every component, written a shard at a time; refused up front when the disk lacks room)")
    checkpoint_make.add_argument("--components", default=None,
                                 help="comma-separated components to write (default: all the pipeline declares)")
    checkpoint_make.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    checkpoint_make.add_argument("--layers", type=int, default=None,
                                 help="release only: keep the transformers' first N of 50 blocks (the same weights as "
                                 "those blocks of the whole model; 1.3 GB a block), for a smaller release-width folder")
    checkpoint_make.add_argument("--max-shard-size", default="5GB",
                                 help="largest safetensors shard, which is also about the host memory a model's "
                                 "writing holds (default: 5GB, the Hub's recommended size)")
    checkpoint_make.set_defaults(run=_checkpoint_make)

    init = commands.add_parser(
        "init",
        help="set the repository in this folder up for the gates: a gate suite file, pytest.ini, a thresholds folder "
        "(and with --model its contracts), then print the next commands",
        description="Writes the gate suite (--suite, pytest-h3's markers and fixtures: kernel, block, model and "
        "generation gates), pytest.ini where pytest has no configuration here (junit_family = xunit1, and this folder "
        "as pytest's rootdir), and the thresholds folder with its lock and thresholds/suite.json, the record of the "
        "suite that every printed command names. Run it at the repository's root. Existing files are refused unless "
        "--force; an existing pytest configuration is never edited.",
    )
    init.add_argument("--model", "--h3-model", dest="model", default=None,
                      help="also write and lock the contracts of this model: tiny, edge, small, release or a checkpoint "
                      "folder")
    init.add_argument("--suite", default=DEFAULT_SUITE, help=f"the gate suite file to write (default: {DEFAULT_SUITE})")
    init.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    init.add_argument("--device", default=None, help="the --h3-device of the printed commands (default: cuda when "
                      "visible)")
    init.add_argument("--force", action="store_true", help="replace files init would write that exist already")
    init.set_defaults(run=_init)

    contracts = commands.add_parser(
        "contracts",
        help="write and lock the default contracts of a model (model contract at its own canvas, generation and "
        "generation-preflight), then print the commands that freeze its bounds",
        description="Writes thresholds/<model>/model-contract.json, generation-contract.json and "
        "generation-preflight-contract.json (h3gate.generation.default_contracts says what they pin: a model narrower "
        "than the release one generates as the tiny preset, fl2va in 8 steps) and locks them; existing contracts are "
        "kept unless --replace gives a reason.",
    )
    contracts.add_argument("--model", "--h3-model", dest="model", required=True,
                           help="a checkpoint folder, a preset (tiny, edge, small) or release")
    contracts.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    contracts.add_argument("--device", default=None, help="the --h3-device of the printed commands (default: cuda when "
                           "visible)")
    contracts.add_argument("--replace", metavar="REASON", default=None, help="overwrite existing contracts, for this "
                           "reason (their frozen bounds no longer match)")
    contracts.add_argument("--canvas", metavar="FxHxW", default=None,
                           help="the model contract's latent frames, height and width, where the model and block gates "
                           "measure (default: the folder's own canvas over its VAE's compression; a test-sized "
                           "transformer alone: the tiny preset's)")
    contracts.set_defaults(run=_contracts)
