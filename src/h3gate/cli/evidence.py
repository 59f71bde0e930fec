"""``h3gate keygen``, ``verify``, ``sign``, ``report``, ``bundle``, ``merge``: the commands over evidence files."""

from __future__ import annotations

import argparse
from pathlib import Path

from h3gate.cli.common import free_folder, printable, refuse


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


def _keygen(args) -> int:
    from h3gate.evidence.signing import keygen, keyid, load_public_key

    problem = free_folder(Path(args.out_dir))
    if problem:
        return refuse("keygen", 2, problem)
    try:
        private, public = keygen(Path(args.out_dir))
    except (FileExistsError, OSError) as error:
        return refuse("keygen", 2, str(error))
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
    """The options of verify and sign that say what the evidence must hold, as :func:`h3gate.evidence.verify.verify`'s
    arguments; a bad one is a ValueError naming it."""
    import re

    from h3gate.evidence.candidate_lock import read as read_candidate_lock
    from h3gate.evidence.profiles import profile

    if args.expect_model is not None and not re.fullmatch(r"[0-9a-f]{64}", args.expect_model):
        raise ValueError(f"--expect-model={args.expect_model} is not a model identity (64 hex digits, as "
                         "`h3gate identity --model M` prints it)")
    return {
        "thresholds": args.thresholds,
        "required": profile(args.profile) if args.profile else None,
        "candidate": args.expect_candidate,
        "model": args.expect_model,
        "candidate_lock": read_candidate_lock(Path(args.expect_candidate_lock)) if args.expect_candidate_lock else None,
    }


def _verify(args) -> int:
    """A trust decision first: the keys that may vouch for a verdict, or --allow-unsigned, whose PASSED is never
    exit 0."""
    from h3gate.evidence.signing import EvidenceError, load_public_key, load_public_keys
    from h3gate.evidence.verify import verify

    if not (args.key or args.keyring or args.allow_unsigned):
        return refuse("verify", 2, "no trust decision: pass --key PUB or --keyring FILE (the public keys you trust "
                       "to sign evidence), or --allow-unsigned to check everything but the signature")
    for path, what in ((args.evidence, "evidence"), (args.root, "--root"), (args.thresholds, "--thresholds")):
        if path is not None and not _exists(path):
            return refuse("verify", 2, f"{what} {path} does not exist")
    try:
        trusted = [load_public_key(path) for path in args.key or ()]
        trusted += load_public_keys(args.keyring) if args.keyring else []
        checks = _checks(args)
    except ValueError as error:
        return refuse("verify", 2, str(error))
    try:
        outcome = verify(Path(args.evidence), trusted or None, root=args.root, **checks)
    except EvidenceError as error:
        return refuse("verify", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    if not outcome.trusted:
        return refuse("verify", EXIT_CODES["untrusted"], f"untrusted: {outcome.line()} (--allow-unsigned: no "
                       "trusted key vouches for this verdict)")
    print(printable(outcome.line()))
    return 0


def _sign(args) -> int:
    """Signs a run's unsigned evidence after verifying it here: the key vouches only for what this h3gate, with
    these thresholds and this profile, finds PASSED."""
    from h3gate.evidence.signing import KEY_ENV, EvidenceError, keyid, load_private_key
    from h3gate.evidence.verify import AlreadySigned, sign_verified

    for path, what in ((args.evidence, "evidence"), (args.thresholds, "--thresholds")):
        if not _exists(path):
            return refuse("sign", 2, f"{what} {path} does not exist")
    try:
        key = load_private_key(args.key)
        checks = _checks(args)
    except ValueError as error:
        return refuse("sign", 2, str(error))
    if key is None:
        return refuse("sign", 2, f"no signing key: pass --key PRIV or set {KEY_ENV} to the PEM text")
    try:
        path = sign_verified(Path(args.evidence), key, **checks)
    except EvidenceError as error:
        return refuse("sign", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except AlreadySigned as error:
        return refuse("sign", 2, str(error))
    except OSError as error:
        return refuse("sign", 2, str(error))
    print(printable(f"signed {path} (keyid {keyid(key.public_key())[:16]})"))
    return 0


def _report(args) -> int:
    from h3gate.evidence.review import write_report
    from h3gate.evidence.signing import EvidenceError

    evidence = Path(args.evidence)
    if not evidence.exists():
        return refuse("report", 2, f"evidence {evidence} does not exist")
    out = Path(args.out) if args.out else (evidence if evidence.is_dir() else evidence.parent) / "report.md"
    problem = free_folder(out.parent)
    if problem:
        return refuse("report", 2, f"-o {out}: {problem}")
    try:
        print(printable(write_report(evidence, out)))
    except EvidenceError as error:
        return refuse("report", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except (KeyError, TypeError, AttributeError) as error:  # a well-formed statement without a field shown
        return refuse("report", EXIT_CODES["malformed"], f"malformed: a test result lacks what the report shows "
                       f"({type(error).__name__}: {error}); `h3gate verify` says whether the evidence holds")
    except OSError as error:  # a WriteError: no room, no permission
        return refuse("report", 2, str(error))
    return 0


def _bundle(args) -> int:
    from h3gate.evidence.bundle import bundle
    from h3gate.evidence.signing import EvidenceError

    if not Path(args.evidence).exists():
        return refuse("bundle", 2, f"evidence {args.evidence} does not exist")
    try:
        written = bundle(Path(args.evidence), Path(args.out))
    except EvidenceError as error:
        return refuse("bundle", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except OSError as error:
        return refuse("bundle", 2, str(error))
    print(printable(f"bundled {len(written)} files into {args.out}: verify it as downloaded with h3gate verify {args.out} --key PUB"))
    return 0


def _merge(args) -> int:
    from h3gate.evidence.merge import merge
    from h3gate.evidence.signing import EvidenceError, keyid, load_private_key

    for shard in args.shards:
        if not Path(shard).exists():
            return refuse("merge", 2, f"shard {shard} does not exist")
    problem = free_folder(Path(args.out))
    if problem:
        return refuse("merge", 2, f"-o {args.out}: {problem}")
    try:
        key = load_private_key(args.key)
    except ValueError as error:
        return refuse("merge", 2, str(error))
    try:
        path = merge([Path(shard) for shard in args.shards], Path(args.out), key)
    except EvidenceError as error:
        return refuse("merge", EXIT_CODES[error.kind], f"{error.kind}: {error.reason}")
    except (ValueError, OSError) as error:  # a shard's artifact outside -o; a folder that cannot be written
        return refuse("merge", 2, str(error))
    signed = f"signed, keyid {keyid(key.public_key())[:16]}" if key else "UNSIGNED"
    print(f"merged {len(args.shards)} shards into {path} ({signed})")
    return 0


def _add_checks(parser: argparse.ArgumentParser, thresholds_required: bool) -> None:
    """The options shared by verify and sign: what the evidence must hold."""
    from h3gate.evidence.profiles import described

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


def add_commands(commands) -> None:
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
