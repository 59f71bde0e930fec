"""``h3gate variants``, ``identity``, ``candidates``: what the numerics modes, a model's or candidate's identity and the
registered candidates are."""

from __future__ import annotations

from pathlib import Path

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


def add_commands(commands) -> None:
    variants = commands.add_parser("variants", help="list the numerics modes (golden, provider, variants) of a device")
    variants.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    variants.set_defaults(run=_variants)

    identity = commands.add_parser(
        "identity", help="print a model's identity digest, or a candidate's (and write its lock)",
        description="Without --candidate: the model's identity digest (for verify --expect-model). With --candidate: "
        "the candidate's identity digest and the h3gate that computed it; --lock FILE writes them as the candidate "
        "lock verify --expect-candidate-lock checks. Run it where the gates run: the identity holds the triton "
        "version, TRITON_INTERPRET and H3_TRITON_AUTOTUNE.",
    )
    identity.add_argument("--model", default="tiny", help="tiny, edge, small or a checkpoint folder (default: tiny)")
    identity.add_argument("--seed", type=int, default=0, help="weight seed of an embedded model (default: 0)")
    identity.add_argument("--candidate", metavar="SPEC", help="a candidate spec, as --h3-candidate takes it")
    identity.add_argument("--lock", metavar="FILE", help="with --candidate: write the candidate lock here")
    identity.set_defaults(run=_identity)

    candidates = commands.add_parser("candidates", help="list the registered candidates (ops, supports and options where declared)")
    candidates.set_defaults(run=_candidates)
