"""Signing: DSSE envelopes signed with Ed25519, and the keys that sign and check them.

DSSE is the envelope supply-chain tools already read, so a reviewer can check evidence with any DSSE verifier,
not only with this tool. Ed25519 comes from ``cryptography``: the maintained OpenSSL binding, shipped as wheels
everywhere, and it reads the PEM keys :func:`keygen` writes. This is the only module that imports it, so what
needs only profiles and verdicts (:mod:`h3gate.evidence.profiles`) loads without it.

The signing key comes from a PEM file path, or else from ``H3GATE_SIGN_KEY``, which holds the PEM *text*
(CI secret stores hand out contents, not files); a path in the variable is refused, not guessed at.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from h3gate.files import FileFormatError, read_json, read_regular, sha256_bytes, write_atomic

PAYLOAD_TYPE = "application/vnd.in-toto+json"
EVIDENCE_NAME = "evidence.json"
PRIVATE_KEY_NAME = "h3gate-signing-key.pem"
PUBLIC_KEY_NAME = "h3gate-signing-key.pub.pem"
KEY_ENV = "H3GATE_SIGN_KEY"
MAX_KEYRING_BYTES = 1 << 20  # thousands of keys; more is not a keyring

# The key types, named here so modules that pass keys along need not import cryptography for an annotation.
PrivateKey = Ed25519PrivateKey
PublicKey = Ed25519PublicKey


class EvidenceError(Exception):
    """Evidence that does not hold up. ``kind`` says which check refused it (the CLI maps it to an exit code):
    malformed, signature, unsigned, mismatch, digest, lock, incomplete, failed, conflict."""

    def __init__(self, kind: str, reason: str):
        self.kind = kind
        self.reason = reason
        super().__init__(reason)


class SigningKeyError(ValueError):
    """A signing or verification key that cannot be used; the message names its source and the fix."""


def canonical(value) -> bytes:
    """The bytes that are signed and digested: compact JSON, sorted keys, UTF-8, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def keyid(public_key: PublicKey) -> str:
    """sha256 hex of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_bytes(raw)


def sign(payload: bytes, key: PrivateKey | None) -> dict:
    """The DSSE envelope of ``payload``, signed by ``key``; no key: no signatures."""
    signatures = []
    if key is not None:
        signature = key.sign(pae(PAYLOAD_TYPE, payload))
        signatures.append({"keyid": keyid(key.public_key()), "sig": base64.b64encode(signature).decode()})
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(), "signatures": signatures}


def _b64decode(text, what: str) -> bytes:
    """DSSE allows standard or URL-safe base64."""
    if not isinstance(text, str):
        raise EvidenceError("malformed", f"{what} is not a base64 string")
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError) as error:
        raise EvidenceError("malformed", f"{what} is not valid base64 ({error})") from None


@dataclass
class Envelope:
    path: Path
    payload: bytes
    signatures: list[dict]

    def signed_by(self) -> list[str]:
        return sorted(s["keyid"] for s in self.signatures)

    def check_signature(self, trusted: list[PublicKey]) -> str:
        """The keyid of a trusted key whose signature verifies, or an EvidenceError (unsigned / signature)."""
        wanted = {keyid(key): key for key in trusted}
        if not self.signatures:
            raise EvidenceError("unsigned", f"{self.path} is unsigned, but a trusted key was given: the run was not signed")
        matching = [s for s in self.signatures if s["keyid"] in wanted]
        if not matching:
            others = ", ".join(s["keyid"][:16] for s in self.signatures)
            names = ", ".join(k[:16] for k in sorted(wanted))
            raise EvidenceError("signature", f"{self.path} has no signature by a trusted key ({names}); signed by {others}")
        message = pae(PAYLOAD_TYPE, self.payload)
        for signature in matching:  # every one: a garbage signature listed first must not hide a valid one
            try:
                wanted[signature["keyid"]].verify(_b64decode(signature["sig"], "signature"), message)
                return signature["keyid"]
            except (InvalidSignature, EvidenceError):
                continue
        raise EvidenceError(
            "signature",
            f"{self.path}: signature by key {matching[0]['keyid'][:16]} does not verify ({len(matching)} by a trusted "
            "keyid tried): the statement was changed after signing",
        )


def open_envelope(path: Path) -> Envelope:
    """The DSSE envelope at ``path`` (a file, or a folder holding evidence.json), structure checked."""
    path = Path(path)
    if path.is_dir():
        path = path / EVIDENCE_NAME
    try:
        data = read_json(path, "DSSE evidence envelope")
    except FileFormatError as error:
        raise EvidenceError("malformed", str(error)) from None
    if data.get("payloadType") != PAYLOAD_TYPE:
        raise EvidenceError(
            "malformed", f"{path}: payloadType is {data.get('payloadType')!r}, expected {PAYLOAD_TYPE!r}"
        )
    signatures = data.get("signatures")
    if not isinstance(signatures, list) or not all(
        isinstance(s, dict) and isinstance(s.get("keyid"), str) and isinstance(s.get("sig"), str) for s in signatures
    ):
        raise EvidenceError("malformed", f"{path}: signatures must be a list of {{keyid, sig}} strings")
    return Envelope(path, _b64decode(data.get("payload"), f"{path}: payload"), signatures)


# Keys ------------------------------------------------------------------------------------------------------


def keygen(out_dir: Path) -> tuple[Path, Path]:
    """A new Ed25519 key pair: private PEM (mode 0600, from its first byte on disk) and public PEM."""
    out_dir = Path(out_dir)
    private_path, public_path = out_dir / PRIVATE_KEY_NAME, out_dir / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} exists: a signing key is never overwritten; choose another folder")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_atomic(private_path, private_pem, mode=0o600)  # 0600 before any byte is written
    write_atomic(public_path, public_pem)
    os.chmod(public_path, 0o644)
    return private_path, public_path


def _private_from_pem(pem: bytes, source: str) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:
        raise SigningKeyError(
            f"{source}: not an unencrypted PEM private key ({error}); create one with `h3gate keygen DIR`"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(
            f"{source}: a {type(key).__name__}, but evidence is signed with Ed25519; "
            "create one with `h3gate keygen DIR`"
        )
    return key


def load_private_key(path: str | os.PathLike | None = None) -> PrivateKey | None:
    """The signing key from the PEM file ``path``; without one, from ``H3GATE_SIGN_KEY`` (PEM text); else None."""
    if path is not None:
        path = Path(path)
        try:
            return _private_from_pem(read_regular(path, "signing key PEM", MAX_KEYRING_BYTES), str(path))
        except FileFormatError as error:
            raise SigningKeyError(f"cannot read the signing key: {error}") from None
    text = os.environ.get(KEY_ENV)
    if not text:
        return None
    if "-----BEGIN" not in text:
        raise SigningKeyError(
            f"{KEY_ENV} must hold the PEM text of an Ed25519 private key, not a path; pass a key file as a path instead"
        )
    return _private_from_pem(text.encode(), KEY_ENV)


def load_public_keys(path: str | os.PathLike) -> list[PublicKey]:
    """Every Ed25519 public key of a PEM file: one (``--key``), or several concatenated (a ``--keyring``)."""
    path = Path(path)
    try:
        text = read_regular(path, "public key PEM", MAX_KEYRING_BYTES)
    except FileFormatError as error:
        raise SigningKeyError(str(error)) from None
    blocks = re.findall(rb"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", text, re.DOTALL)
    if not blocks:
        raise SigningKeyError(f"{path}: holds no PEM public key; `h3gate keygen` writes {PUBLIC_KEY_NAME}")
    if text.count(b"-----BEGIN") != len(blocks) or text.count(b"-----END") != len(blocks):
        raise SigningKeyError(f"{path}: holds a PEM block that is not a whole public key (truncated, or another kind "
                              "of key); a keyring is whole public key PEMs, concatenated")
    keys = []
    for block in blocks:
        try:
            key = serialization.load_pem_public_key(block)
        except (ValueError, UnsupportedAlgorithm) as error:
            raise SigningKeyError(f"{path}: not a PEM public key ({error}); `h3gate keygen` writes {PUBLIC_KEY_NAME}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningKeyError(f"{path}: a {type(key).__name__}, but evidence is signed with Ed25519")
        keys.append(key)
    return keys


def load_public_key(path: str | os.PathLike) -> PublicKey:
    """The one public key of a PEM file; a file of several is a keyring and is refused here, naming the option."""
    keys = load_public_keys(path)
    if len(keys) > 1:
        raise SigningKeyError(f"{path}: holds {len(keys)} public keys; pass a file of several as --keyring")
    return keys[0]
