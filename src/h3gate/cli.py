"""``h3gate``: the engine's command line (models, variants, candidates, contract locking, evidence).

argparse, because it ships with Python and gives every subcommand its own ``--help``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _variants(args) -> int:
    from h3gate import numerics

    problem = _device_problem(args.device)
    if problem:
        return _refuse("variants", 2, problem)
    for mode in (numerics.GOLDEN, numerics.PROVIDER, *numerics.variants(args.device)):
        print(f"{mode.name:16s} {mode.description}")
    return 0


def _identity(args) -> int:
    from h3gate.model import ModelError, load_model

    if args.candidate is not None:
        return _candidate_identity(args)
    if args.lock is not None:
        return _refuse("identity", 2, "--lock writes a candidate lock: give the candidate with --candidate SPEC")
    try:
        model = load_model(args.model, args.seed)
    except ModelError as error:
        return _refuse("identity", 2, str(error))
    print(f"{model.name} {model.identity} ({model.source})")
    return 0


def _candidate_identity(args) -> int:
    from h3gate import candidate_lock
    from h3gate.candidates import CandidateError, load
    from h3gate.evidence import candidate_digest, tool

    try:
        identity = load(args.candidate).identity()
    except CandidateError as error:
        return _refuse("identity", 2, f"--candidate {args.candidate}: {error}")
    writer = tool()
    if args.lock is not None:
        problem = _free_folder(Path(args.lock).parent)
        if problem:
            return _refuse("identity", 2, f"--lock {args.lock}: {problem}")
        try:
            candidate_lock.write(Path(args.lock), identity)
        except OSError as error:
            return _refuse("identity", 2, str(error))
    print(printable(f"{identity['name']} {candidate_digest(identity)} (h3gate {writer['version']} source "
                    f"{writer['source_sha256'][:16]})" + (f"; locked in {args.lock}" if args.lock else "")))
    return 0


def _capture(args) -> int:
    from h3gate.bounds import BoundsError
    from h3gate.gates import block
    from h3gate.model import ModelError, load_model

    path = Path(args.capture)
    if not path.name.endswith(block.CAPTURE_SUFFIX):
        print(f"h3gate capture: {path} is not a block capture (block<N>{block.CAPTURE_SUFFIX})", file=sys.stderr)
        return 2
    bounds = path.with_name(path.name.removesuffix(block.CAPTURE_SUFFIX) + "-bounds.json")
    if not bounds.is_file():
        return _refuse("capture", 2, f"{path} has no {bounds.name} beside it: give the capture's path under "
                       "thresholds/<model>/<device class>/, where its block's bounds were frozen")
    device = args.device or ("cpu" if path.parent.name == "cpu" else "cuda")
    try:
        model = load_model(args.model or path.parent.parent.name)
    except ModelError as error:
        named = "" if args.model else " (as --model; the default is the thresholds folder's name)"
        return _refuse("capture", 2, f"{error}{named}")
    try:
        written = block.recapture(path, model, device)
    except BoundsError as error:
        return _refuse("capture", 1, str(error))
    print(f"captured {written}: bitwise the frozen capture")
    return 0


def _candidates(args) -> int:
    from h3gate.candidates import available, describe

    for name, factory in sorted(available().items()):
        print(name)
        for line in describe(name, factory):
            print(f"  {line}")
    return 0


def _lock(args) -> int:
    from h3gate import contract, generation_contract
    from h3gate.bounds import lock_files
    from h3gate.files import FileFormatError

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
        return _refuse("lock", 2, str(error))
    for path in paths:
        print(f"locked {path.relative_to(thresholds)}")
    return 0


def _status(args) -> int:
    from h3gate.status import status

    try:
        report = status(args.thresholds, args.model, args.device)
    except ValueError as error:
        return _refuse("status", 2, str(error))
    print(report.table())
    return 0 if report.ok else 1


STATUS_CODES = """exit codes:
  0  every file is present and locked
  1  a file is missing or stale (each such row says the command that makes it)
  2  usage: bad arguments, an unknown model"""


def _checkpoint_make(args) -> int:
    from h3gate.checkpoint import CheckpointError
    from h3gate.checkpoint_writer import make

    problem = _free_folder(Path(args.folder).parent)
    if problem:
        return _refuse("checkpoint make", 2, f"DIR {args.folder}: {problem}")
    components = args.components.split(",") if args.components else None
    try:
        folder = make(args.preset, args.folder, components, args.seed, args.max_shard_size, progress=sys.stderr,
                      layers=args.layers)
    except CheckpointError as error:
        return _refuse("checkpoint make", 2, str(error))
    what = f"the {args.preset} preset" + (f"'s first {args.layers} blocks" if args.layers else "")
    print(f"wrote {folder}: {what} as a MiniMax-H3 checkpoint folder (--h3-model={folder})")
    print(f"next, write and lock its contracts: h3gate contracts --model={shlex.quote(str(folder))}")
    return 0


def _contracts(args) -> int:
    from h3gate import contract_defaults
    from h3gate.bounds import BoundsError

    problem = _free_folder(Path(args.thresholds))
    if problem:
        return _refuse("contracts", 2, f"--thresholds {args.thresholds}: {problem}")
    try:
        canvas = contract_defaults.parse_canvas(args.canvas) if args.canvas else None
        paths = contract_defaults.write(args.model, args.thresholds, args.replace, canvas)
    except (BoundsError, ValueError, OSError) as error:
        return _refuse("contracts", 2, str(error))
    for path in paths:
        print(f"wrote and locked {path}" + (f" (replaced: {args.replace})" if args.replace else ""))
    _print_next_after_contracts(args.model, args.device, args.thresholds)
    return 0


def _print_next_after_contracts(model: str, device: str | None, thresholds: str) -> None:
    """The freeze commands of the contracts just written, then the command that checks a candidate: each names the
    repository's own gate suite (:mod:`h3gate.suite`)."""
    from h3gate import contract_defaults, status, suite

    shown = None if thresholds == status.DEFAULT_THRESHOLDS else thresholds
    device = device or status.default_device(model)
    print("next, freeze the bounds (cheap gates first):")
    for command in contract_defaults.freeze_commands(model, device, shown):
        print(f"  {command}")
    print("then check a candidate (--h3-candidate, default h3_triton) with the gates that read them:")
    print(f"  {status.check_command(suite.recorded(thresholds), model, device, shown)}")


def _init(args) -> int:
    """Set the repository in the current folder up: gate suite, pytest.ini, thresholds folder; with --model its
    contracts too. Every refusal comes before the first file is written."""
    from h3gate import contract_defaults, repository
    from h3gate.bounds import BoundsError

    root, thresholds = Path.cwd(), Path(args.thresholds)
    problem = _free_folder(thresholds)
    if problem:
        return _refuse("init", 2, f"--thresholds {args.thresholds}: {problem}")
    try:
        written = repository.plan(root, args.suite, thresholds, args.force)
        contracts = contract_defaults.paths(args.model, thresholds) if args.model else []
    except (repository.SetupError, ValueError) as error:
        return _refuse("init", 2, str(error))
    existing = [path for path in contracts if path.exists()]
    if existing and not args.force:
        return _refuse("init", 2, f"{existing[0]} exists: init overwrites no contract (bounds were frozen for it); "
                       "pass --force to write the defaults anyway")
    try:
        paths = repository.write(thresholds, written)
    except OSError as error:
        return _refuse("init", 2, str(error))
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
        for path in contract_defaults.write(args.model, thresholds, "h3gate init --force" if args.force else None):
            print(f"wrote and locked {path}")
    except (BoundsError, ValueError, OSError) as error:
        return _refuse("init", 2, str(error))
    _print_next_after_contracts(args.model, args.device, args.thresholds)
    return 0


# Evidence -----------------------------------------------------------------------------------------------

# One exit code per kind of refusal, so CI can tell a tampered artifact from a failed gate without parsing text.
EXIT_CODES = {
    "signature": 3,
    "unsigned": 4,
    "digest": 5,
    "lock": 6,
    "incomplete": 7,
    "failed": 8,
    "malformed": 9,
    "conflict": 10,
    "untrusted": 11,
    "mismatch": 12,
}
VERIFY_CODES = """exit codes:
  0  PASSED and complete, signed by a trusted key (--key or --keyring); artifacts, SHA256SUMS and
     redaction.json match; lock matches (when --thresholds); candidate and model as expected
  2  usage: bad arguments, no trust decision, a key file that is not whole PEM public keys (a truncated
     block included), a missing file or folder, a candidate lock that is not one
  3  bad signature: no signature by a trusted key verifies (every one by a trusted keyid is tried), or the
     statement changed after signing
  4  unsigned evidence although a trusted key was given
  5  an artifact is missing, not a regular file, or its sha256 differs from the evidence; SHA256SUMS or
     redaction.json is missing, not a regular file, or disagrees with the evidence
  6  the thresholds lock does not verify, or a bounds/contract digest differs from the locked one
  7  incomplete: a required gate was skipped, deselected or crashed (a built-in profile name means its
     built-in requirements, whatever the evidence records; --profile asks for another)
  8  one or more gate tests failed
  9  malformed evidence: not a regular file of at most 256 MiB holding a DSSE envelope of an h3gate
     statement; unsafe subject names (outside the folder, control or line separator characters, a
     component over 255 bytes); hostile JSON; a candidate entry whose name or digest disagrees with its
     identity; verdict fields that do not follow from the recorded tests
  11 --allow-unsigned: every other check holds, but no trusted signature vouches for the verdict
  12 the evidence qualifies another candidate or model than --expect-candidate / --expect-model, or
     another candidate identity or h3gate than --expect-candidate-lock"""
SIGN_CODES = """exit codes:
  0  verified as `h3gate verify --allow-unsigned` would pass it, written by this h3gate, and signed in place
  2  usage: bad arguments, no signing key, an unreadable key, evidence that is signed already
  5-9, 12  as `h3gate verify` (see its --help): nothing is signed
  12 also: another h3gate (version or source digest) wrote the evidence"""
REPORT_CODES = """exit codes:
  0  the report is written
  2  usage: bad arguments, missing evidence, an output path that cannot be written
  9  malformed evidence: not a DSSE envelope of an h3gate statement, or a test result lacks what the report shows"""
MERGE_CODES = """exit codes:
  0  merged
  2  usage: bad arguments, unreadable key, missing shard
  3  with a key: a shard's signature is not by that key or does not verify
  4  with a key: a shard is unsigned
  9  a shard is malformed evidence
  10 shards conflict: different model, candidate, bounds, contracts or profile, a test in two shards, or
     one artifact name with two digests (the message names the difference)"""


def printable(text: str) -> str:
    """``text`` on one line with every control or format character escaped: what evidence holds is printed,
    and an escape sequence in it must not repaint the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(text))


def _refuse(command: str, code: int, reason: str) -> int:
    print(printable(f"h3gate {command}: {reason}"), file=sys.stderr)
    return code


def _free_folder(path: Path) -> str | None:
    """Why ``path`` cannot be an output folder (it is a file, or sits under one), or None."""
    blocking = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        return f"{blocking} is a file, not a folder: give a folder"
    return None


def _device_problem(device: str | None) -> str | None:
    """Why ``--device`` names no device the gates run on, or None; torch would accept others (mps, meta) and fail
    later, or refuse a typo with a traceback."""
    import re

    if device is None or re.fullmatch(r"cpu|cuda(:\d+)?", device):
        return None
    return f"--device {device}: not a device; use cpu, cuda or cuda:N"


def _keygen(args) -> int:
    from h3gate.signing import keygen, keyid, load_public_key

    problem = _free_folder(Path(args.out_dir))
    if problem:
        return _refuse("keygen", 2, problem)
    try:
        private, public = keygen(Path(args.out_dir))
    except (FileExistsError, OSError) as error:
        return _refuse("keygen", 2, str(error))
    print(f"private key {private} (mode 0600: keep it secret, e.g. as the CI secret H3GATE_SIGN_KEY)")
    print(f"public key  {public} (keyid {keyid(load_public_key(public))})")
    return 0


def _exists(path) -> bool:
    """Whether ``path`` exists; a name the file system cannot hold (too long) does not."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def _checks(args) -> dict:
    """The options of verify and sign that say what the evidence must hold, as :func:`h3gate.evidence.verify`'s
    arguments; a bad one is a ValueError naming it."""
    import re

    from h3gate import candidate_lock, profiles

    if args.expect_model is not None and not re.fullmatch(r"[0-9a-f]{64}", args.expect_model):
        raise ValueError(f"--expect-model={args.expect_model} is not a model identity (64 hex digits, as "
                         "`h3gate identity --model M` prints it)")
    return {
        "thresholds": args.thresholds,
        "required": profiles.profile(args.profile) if args.profile else None,
        "candidate": args.expect_candidate,
        "model": args.expect_model,
        "candidate_lock": candidate_lock.read(Path(args.expect_candidate_lock)) if args.expect_candidate_lock else None,
    }


def _verify(args) -> int:
    """A trust decision first: the keys that may vouch for a verdict, or --allow-unsigned, whose PASSED is never
    exit 0."""
    from h3gate import evidence, signing

    if not (args.key or args.keyring or args.allow_unsigned):
        return _refuse("verify", 2, "no trust decision: pass --key PUB or --keyring FILE (the public keys you trust "
                       "to sign evidence), or --allow-unsigned to check everything but the signature")
    for path, what in ((args.evidence, "evidence"), (args.root, "--root"), (args.thresholds, "--thresholds")):
        if path is not None and not _exists(path):
            return _refuse("verify", 2, f"{what} {path} does not exist")
    try:
        trusted = [signing.load_public_key(path) for path in args.key or ()]
        trusted += signing.load_public_keys(args.keyring) if args.keyring else []
        checks = _checks(args)
    except ValueError as error:
        return _refuse("verify", 2, str(error))
    try:
        outcome = evidence.verify(Path(args.evidence), trusted or None, root=args.root, **checks)
    except signing.EvidenceError as error:
        return _refuse("verify", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    if not outcome.trusted:
        return _refuse("verify", EXIT_CODES["untrusted"], f"untrusted: {outcome.line()} (--allow-unsigned: no "
                       "trusted key vouches for this verdict)")
    print(printable(outcome.line()))
    return 0


def _sign(args) -> int:
    """Signs a run's unsigned evidence after verifying it here: the key vouches only for what this h3gate, with
    these thresholds and this profile, finds PASSED."""
    from h3gate import evidence, signing

    for path, what in ((args.evidence, "evidence"), (args.thresholds, "--thresholds")):
        if not _exists(path):
            return _refuse("sign", 2, f"{what} {path} does not exist")
    try:
        key = signing.load_private_key(args.key)
        checks = _checks(args)
    except ValueError as error:
        return _refuse("sign", 2, str(error))
    if key is None:
        return _refuse("sign", 2, f"no signing key: pass --key PRIV or set {signing.KEY_ENV} to the PEM text")
    try:
        path = evidence.sign_verified(Path(args.evidence), key, **checks)
    except signing.EvidenceError as error:
        return _refuse("sign", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except evidence.AlreadySigned as error:
        return _refuse("sign", 2, str(error))
    except OSError as error:
        return _refuse("sign", 2, str(error))
    print(printable(f"signed {path} (keyid {signing.keyid(key.public_key())[:16]})"))
    return 0


def _report(args) -> int:
    from h3gate.signing import EvidenceError
    from h3gate.report import write_report

    evidence = Path(args.evidence)
    if not evidence.exists():
        return _refuse("report", 2, f"evidence {evidence} does not exist")
    out = Path(args.out) if args.out else (evidence if evidence.is_dir() else evidence.parent) / "report.md"
    problem = _free_folder(out.parent)
    if problem:
        return _refuse("report", 2, f"-o {out}: {problem}")
    try:
        print(printable(write_report(evidence, out)))
    except EvidenceError as error:
        return _refuse("report", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except (KeyError, TypeError, AttributeError) as error:  # a well-formed statement without a field shown
        return _refuse("report", EXIT_CODES["malformed"], f"malformed: a test result lacks what the report shows "
                       f"({type(error).__name__}: {error}); `h3gate verify` says whether the evidence holds")
    except OSError as error:  # a WriteError: no room, no permission
        return _refuse("report", 2, str(error))
    return 0


def _bundle(args) -> int:
    from h3gate import evidence, signing

    if not Path(args.evidence).exists():
        return _refuse("bundle", 2, f"evidence {args.evidence} does not exist")
    try:
        written = evidence.bundle(Path(args.evidence), Path(args.out))
    except signing.EvidenceError as error:
        return _refuse("bundle", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except OSError as error:
        return _refuse("bundle", 2, str(error))
    print(printable(f"bundled {len(written)} files into {args.out}: verify it as downloaded with h3gate verify {args.out} --key PUB"))
    return 0


def _merge(args) -> int:
    from h3gate import evidence, signing

    for shard in args.shards:
        if not Path(shard).exists():
            return _refuse("merge", 2, f"shard {shard} does not exist")
    problem = _free_folder(Path(args.out))
    if problem:
        return _refuse("merge", 2, f"-o {args.out}: {problem}")
    try:
        key = signing.load_private_key(args.key)
    except ValueError as error:
        return _refuse("merge", 2, str(error))
    try:
        path = evidence.merge([Path(shard) for shard in args.shards], Path(args.out), key)
    except signing.EvidenceError as error:
        return _refuse("merge", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except (ValueError, OSError) as error:  # a shard's artifact outside -o; a folder that cannot be written
        return _refuse("merge", 2, str(error))
    signed = f"signed, keyid {signing.keyid(key.public_key())[:16]}" if key else "UNSIGNED"
    print(f"merged {len(args.shards)} shards into {path} ({signed})")
    return 0


def _bench(args) -> int:
    import shlex

    import torch

    from h3gate import bench
    from h3gate.candidates import load
    from h3gate.files import dumps, write_atomic

    problem = _device_problem(args.device)
    if problem:
        return _refuse("bench", 2, problem)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    shape = args.shape or ("release" if device.startswith("cuda") else "small")
    command = "h3gate " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    def save(report):
        print(bench.table(report), flush=True)
        if args.out:
            write_atomic(args.out, dumps({**report, "command": command}))

    ops = args.ops.split(",") if args.ops else None
    try:
        candidate = load(args.candidate)
        bench.check_ops(ops)
    except ValueError as error:  # an unknown candidate or op, refused before any timing
        return _refuse("bench", 2, str(error))
    bench.run(
        candidate,
        shape,
        device,
        ops=ops,
        block=not args.no_block,
        step_layers=args.step_layers or None,
        progress=lambda message: print(f"  timing {message}", file=sys.stderr, flush=True),
        on_section=save,
        grad_kind=args.output_grad,
    )
    return 0


def _power(args) -> int:
    import torch

    from h3gate import numerics, power
    from h3gate.candidates import load
    from h3gate.files import dumps, write_atomic
    from h3gate.model import load_model

    from h3gate.bounds import BoundsError
    from h3gate.files import FileFormatError

    problem = _device_problem(args.device)
    if problem:
        return _refuse("power", 2, problem)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # the bits of the gate suite's power test: pytest-h3 runs CPU sessions on one thread too
        numerics.one_cpu_thread()
    try:
        base = load(args.base or ("h3_triton" if device.startswith("cuda") else "provider"))
        report = power.measure(
            load_model(args.model),
            device,
            Path(args.thresholds),
            Path(args.out),
            base,
            mutants=args.mutants.split(",") if args.mutants else tuple(power.MUTANTS),
            variants=args.variants.split(",") if args.variants else None,
            gates=args.gates.split(",") if args.gates else None,
            progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True),
        )
    except (BoundsError, FileFormatError, ValueError) as error:
        return _refuse("power", 2, str(error))
    print(f"mutants of {base.name}; gates meant for each mutant must catch it, variants must pass everywhere")
    print(report.table())
    print(f"non-discriminating model-gate taps (no mutant exceeded them): {', '.join(report.non_discriminating) or 'none'}")
    for row in report.failures:
        print(f"FAILED {row.subject} x {row.gate}: {row.verdict}: {row.line}")
    for item in report.blind_kernel_items:
        print(f"FAILED kernel {item}: rejected none of its op's mutants (its checks cannot see those bugs)")
    if args.json:
        write_atomic(args.json, dumps(report.to_json()))
    return 0 if report.passed else 1


def _add_checks(parser: argparse.ArgumentParser, thresholds_required: bool) -> None:
    """The options shared by verify and sign: what the evidence must hold."""
    from h3gate.profiles import described

    parser.add_argument("--expect-candidate", metavar="NAME",
                        help="the candidate the evidence must qualify (e.g. h3_triton; else exit 12)")
    parser.add_argument("--expect-candidate-lock", metavar="FILE",
                        help="the candidate lock (`h3gate identity --candidate SPEC --lock FILE`) whose identity and "
                        "h3gate the evidence must have (else exit 12)")
    parser.add_argument("--expect-model", metavar="IDENTITY",
                        help="the model identity digest the evidence must qualify (`h3gate identity`; else exit 12)")
    parser.add_argument("--thresholds", metavar="DIR", required=thresholds_required,
                        help="thresholds folder whose LOCK.json must hold the evidence's bounds and contracts"
                        + ("" if thresholds_required else " (default: not checked)"))
    parser.add_argument("--profile", required=thresholds_required,
                        help=f"the completeness profile to require ({described()}; default: the built-in profile of "
                        "the recorded name, else the recorded one)")


def build_parser() -> argparse.ArgumentParser:
    from h3gate import suite as suite_module
    from h3gate.gates import REGISTRY

    parser = argparse.ArgumentParser(
        prog="h3gate",
        description="Kernel qualification for the MiniMax-H3 transformer. The gates themselves run under pytest "
        "(pytest -m gate); this command inspects and maintains what they use.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

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

    candidates = commands.add_parser("candidates", help="list the registered candidates (ops, supports and options where declared)")
    candidates.set_defaults(run=_candidates)

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
    init.add_argument("--suite", default=suite_module.DEFAULT_FILE,
                      help=f"the gate suite file to write (default: {suite_module.DEFAULT_FILE})")
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
        "generation-preflight-contract.json (h3gate.contract_defaults says what they pin: a model narrower than the "
        "release one generates as the tiny preset, fl2va in 8 steps) and locks them; existing contracts are kept "
        "unless --replace gives a reason.",
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

    bench = commands.add_parser(
        "bench",
        help="time the candidate against the provider: every op forward and backward, one block, one transformer step",
        description="Times are medians (triton.testing.do_bench on a GPU); every ratio is provider time / candidate "
        "time measured in the same process, every rate is also given as a fraction of the GEMM and copy ceilings "
        "measured in the same run. On CPU the kernels run under Triton's interpreter: the numbers only show the "
        "command works.",
    )
    bench.add_argument("--shape", choices=("release", "small"), default=None, help="release (GPU default) or small (CPU default)")
    bench.add_argument("--device", default=None, help="cuda or cpu (default: cuda when visible)")
    bench.add_argument("--candidate", default="h3_triton", help="candidate spec (default: h3_triton)")
    bench.add_argument("--ops", default=None, help="comma-separated ops to time (default: all)")
    bench.add_argument("--no-block", action="store_true", help="skip the one-block benchmark")
    bench.add_argument("--step-layers", type=int, default=0, help="also time one transformer forward with this many blocks (release: 50)")
    bench.add_argument("--output-grad", choices=("random", "ones"), default="random",
                       help="the gradient backward passes start from: seeded normal, or all ones (a degenerate operand "
                       "from which backward passes run faster than from a real gradient)")
    bench.add_argument("-o", "--out", default=None, help="write the JSON report here (e.g. benchmarks/results/h200.json)")
    bench.set_defaults(run=_bench)

    power = commands.add_parser(
        "power",
        help="run every gate against every mutant and every provider variant: the table of what each gate catches",
        description="Mutants (h3gate.mutants) must be caught by the gates meant for them, provider variants must be "
        "accepted everywhere; model-gate taps no mutant exceeded are listed as non-discriminating. Needs the "
        "model's frozen model, block and generation-preflight bounds for the device.",
    )
    power.add_argument("--model", default="tiny", help="tiny (default), edge, small or a checkpoint folder")
    power.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible)")
    power.add_argument(
        "--base",
        default=None,
        help="candidate the mutants are made from (default: h3_triton on a GPU; provider on CPU, where Triton's "
        "interpreter makes each h3_triton gate run take minutes - the bugs are emulated identically around either)",
    )
    power.add_argument("--gates", default=None, help="comma-separated gates (default: every registered gate but power "
                       "and those a test measures: " + ", ".join(
                           name for name, gate in REGISTRY.items() if name != "power" and not gate.measured_by_test) + ")")
    power.add_argument("--mutants", default=None, help="comma-separated mutants (default: all)")
    power.add_argument("--variants", default=None, help="comma-separated provider variants (default: all of the device)")
    power.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    power.add_argument("--out", default="h3-out/power", help="working folder for captures and generations")
    power.add_argument("-o", "--json", default=None, help="write the report as JSON here")
    power.set_defaults(run=_power)

    keygen = commands.add_parser("keygen", help="create an Ed25519 key pair for signing evidence")
    keygen.add_argument("out_dir", metavar="OUT_DIR", help="folder for h3gate-signing-key.pem (0600) and .pub.pem")
    keygen.set_defaults(run=_keygen)

    verify = commands.add_parser(
        "verify",
        help="check evidence: signature, artifact digests, thresholds lock, completeness, verdict",
        description="Check an evidence file; prints one line on success, one reason on stderr otherwise.",
        epilog=VERIFY_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verify.add_argument("evidence", metavar="EVIDENCE", help="evidence.json (or the folder holding it)")
    trust = verify.add_argument_group("trust (one is required)")
    trust.add_argument("--key", metavar="PUB", action="append",
                       help="a trusted public key PEM (repeatable): the evidence must be signed by one (else exit 3/4)")
    trust.add_argument("--keyring", metavar="FILE", help="a file of trusted public key PEMs, concatenated")
    trust.add_argument("--allow-unsigned", action="store_true",
                       help="check everything but the signature; the outcome is then never exit 0 (PASSED exits 11)")
    _add_checks(verify, thresholds_required=False)
    verify.add_argument(
        "--root", metavar="DIR", help="folder of the artifacts, SHA256SUMS and redaction.json (default: the "
        "evidence's folder)"
    )
    verify.set_defaults(run=_verify)

    sign = commands.add_parser(
        "sign",
        help="sign a run's unsigned evidence in place, after verifying it with this h3gate, thresholds and profile",
        description="Checks the evidence as `h3gate verify --allow-unsigned` does, requires that this h3gate (version "
        "and source digest) wrote it, then signs it in place (evidence.json and SHA256SUMS, each written atomically). "
        "Made for CI: the gate job runs the code under test unsigned, and a job on the base branch's code, with its "
        "thresholds, signs what the run produced.",
        epilog=SIGN_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sign.add_argument("evidence", metavar="EVIDENCE", help="evidence.json (or the folder holding it, e.g. a bundle)")
    sign.add_argument("--key", metavar="PRIV", help="private key PEM (default: the PEM text in H3GATE_SIGN_KEY)")
    _add_checks(sign, thresholds_required=True)
    sign.set_defaults(run=_sign)

    report = commands.add_parser(
        "report",
        help="render evidence as markdown with PNG plots, for a PR or CI summary",
        epilog=REPORT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("evidence", metavar="EVIDENCE", help="evidence.json (or the folder holding it)")
    report.add_argument(
        "-o",
        "--out",
        metavar="OUT.md",
        help="markdown to write; plots go to OUT-plots/ beside it (default: report.md beside the evidence)",
    )
    report.set_defaults(run=_report)

    bundle = commands.add_parser(
        "bundle",
        help="copy evidence and everything its verification needs into a new folder: the upload a reviewer verifies",
        description="Writes OUT/evidence.json, SHA256SUMS, redaction.json and every artifact the evidence names, and "
        "nothing else; `h3gate verify OUT` then checks the folder as downloaded. Exit 2: usage (OUT exists); 5: a "
        "file the evidence names is missing; 9: malformed evidence.",
    )
    bundle.add_argument("evidence", metavar="EVIDENCE", help="evidence.json (or the folder holding it)")
    bundle.add_argument("-o", "--out", metavar="OUT", required=True, help="the folder to create")
    bundle.set_defaults(run=_bundle)

    merge = commands.add_parser(
        "merge",
        help="join the evidence of shards (xdist, Slurm tasks) into one",
        description="Join shard evidence into OUT/evidence.json (+ SHA256SUMS, redaction.json). Signed with --key, "
        "else with the PEM text in H3GATE_SIGN_KEY, else unsigned; when signing, every shard must be signed by "
        "that same key.",
        epilog=MERGE_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    merge.add_argument("shards", metavar="SHARD", nargs="+", help="shard evidence.json files (or their folders)")
    merge.add_argument("-o", "--out", metavar="OUT", required=True, help="folder for the merged evidence")
    merge.add_argument(
        "--key", metavar="PRIV", help="private key PEM to sign with (default: H3GATE_SIGN_KEY, else unsigned)"
    )
    merge.set_defaults(run=_merge)
    return parser


def main(argv: list[str] | None = None) -> int:
    from h3gate import quiet

    quiet.install()
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
