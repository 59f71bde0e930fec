"""``h3gate variants``, ``identity``, ``candidates``, ``paths``: what the numerics modes, a model's or candidate's
identity, the registered candidates and the code paths a model's op calls take are."""

from __future__ import annotations

from pathlib import Path

from h3gate.cli import common
from h3gate.cli.common import device_problem, free_folder, printable, refuse


def _variants(args) -> int:
    from h3gate import numerics

    problem = device_problem(args.device)
    if problem:
        return refuse("variants", 2, problem)
    for mode in (numerics.GOLDEN, numerics.PROVIDER, *numerics.variants(args.device)):
        print(f"{mode.name:16s} {mode.description}")
    return 0


def _identity(args) -> int:
    from h3gate.model.factory import ModelError, load_model

    if args.candidate is not None:
        return _candidate_identity(args)
    if args.lock is not None:
        return refuse("identity", 2, "--lock writes a candidate lock: give the candidate with --candidate SPEC")
    try:
        model = load_model(args.model, args.seed)
    except ModelError as error:
        return refuse("identity", 2, str(error))
    print(f"{model.name} {model.identity} ({model.source})")
    return 0


def _candidate_identity(args) -> int:
    from h3gate.candidates import CandidateError, load
    from h3gate.evidence.candidate_lock import write as write_candidate_lock
    from h3gate.evidence.statement import candidate_digest, tool

    try:
        identity = load(args.candidate).identity()
    except CandidateError as error:
        return refuse("identity", 2, f"--candidate {args.candidate}: {error}")
    writer = tool()
    if args.lock is not None:
        problem = free_folder(Path(args.lock).parent)
        if problem:
            return refuse("identity", 2, f"--lock {args.lock}: {problem}")
        try:
            write_candidate_lock(Path(args.lock), identity)
        except OSError as error:
            return refuse("identity", 2, str(error))
    print(printable(f"{identity['name']} {candidate_digest(identity)} (h3gate {writer['version']} source "
                    f"{writer['source_sha256'][:16]})" + (f"; locked in {args.lock}" if args.lock else "")))
    return 0


def _candidates(args) -> int:
    from h3gate.candidates import available, describe

    for name, factory in sorted(available().items()):
        print(name)
        for line in describe(name, factory):
            print(f"  {line}")
    return 0


def _paths(args) -> int:
    import os
    import sys

    device = common.device(args.device)
    if device == "cpu" and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # as pytest-h3 does: before anything imports triton

    from h3gate import op_calls
    from h3gate.gates import kernel
    from h3gate.model.factory import ModelError, load_model
    from h3gate.model.presets import RELEASE, TRANSFORMER_CONFIGS

    suite = args.suite or args.model
    loaders = {name: None if name == RELEASE or name in TRANSFORMER_CONFIGS else lambda name=name: load_model(name)
               for name in (args.model, suite)}
    candidate = common.candidate(args.candidate)
    with common.refusing(ModelError, ValueError):
        calls = op_calls.model_calls(args.model, Path(args.thresholds), loaders[args.model])
        examples_from = kernel.suite_calls(suite, Path(args.thresholds), device, loaders[suite])
        reports = {op: kernel.planned_paths(candidate, op, device, calls=calls, suite=examples_from,
                                            max_examples=args.examples) for op in kernel.OPS}
    print(f"# Paths of {args.model}'s op calls on {device}, candidate {candidate.name}: each planned shape-only, with "
          f"the kernel gate's example that reaches it (pytest -m gate tests/gates/test_kernels.py --h3-model={suite} "
          f"--h3-device={device}; planned here, recorded from its runs there)")
    unreached = 0
    for op, entries in reports.items():
        print(f"\n## {op}")
        for entry in entries:
            print(f"- {entry.line()}")
            unreached += entry.reached_by is None and entry.left_out is None
    print(f"\n{sum(map(len, reports.values()))} paths, {unreached} unreached")
    return 1 if unreached else 0


def add_commands(commands) -> None:
    variants = commands.add_parser("variants", help="list the numerics modes (golden, provider, variants) of a device")
    variants.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    variants.set_defaults(run=_variants)

    identity = commands.add_parser(
        "identity", help="print a model's identity digest, or a candidate's (and write its lock)",
        description="Without --candidate: the model's identity digest (for verify --expect-model). With --candidate: "
        "the candidate's identity digest and the h3gate that computed it; --lock FILE writes them as the candidate "
        "lock verify --expect-candidate-lock checks. Run it where the gates run: the identity holds the triton "
        "version, TRITON_INTERPRET, H3_TRITON_AUTOTUNE and H3_TRITON_DIRECT_LAUNCH.",
    )
    identity.add_argument("--model", default="tiny", help="tiny, edge, small or a checkpoint folder (default: tiny)")
    identity.add_argument("--seed", type=int, default=0, help="weight seed of an embedded model (default: 0)")
    identity.add_argument("--candidate", metavar="SPEC", help="a candidate spec, as --h3-candidate takes it")
    identity.add_argument("--lock", metavar="FILE", help="with --candidate: write the candidate lock here")
    identity.set_defaults(run=_identity)

    candidates = commands.add_parser("candidates", help="list the registered candidates (ops, supports and options where declared)")
    candidates.set_defaults(run=_candidates)

    paths = commands.add_parser(
        "paths",
        help="every code path a model's op calls take (kernel, tiling, specialisation), and the kernel-gate example "
        "that reaches each",
        description="Plans the model's op calls shape-only through the candidate's declared launch paths (no kernel "
        "runs; the release model's calls in seconds), and the kernel gate's examples the same way: exit 1 when a path "
        "the model launches is reached by no example. A path this device cannot launch is listed with the reason.",
    )
    paths.add_argument("--model", default="tiny", help="tiny (default), edge, small, release or a checkpoint folder")
    paths.add_argument("--device", default=None, help="cpu (Triton's interpreter) or cuda (default: cuda when visible)")
    paths.add_argument("--suite", default=None, help="the model whose kernel-gate examples reach the paths (default: "
                       "--model; `make gate` runs tiny's)")
    paths.add_argument("--candidate", default="h3_triton",
                       help="a candidate declaring launch paths (default: h3_triton)")
    paths.add_argument("--examples", type=int, default=8, help="shapes hypothesis draws per op and dtype (the gate's "
                       "--h3-kernel-examples, default 8)")
    paths.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    paths.set_defaults(run=_paths)
