"""DSSE envelopes signed with a key the user gives: ed25519 or ECDSA P-256, nothing keyless.

A provenance statement (:mod:`.provenance`) is signed as a DSSE envelope (the in-toto attestation
framework's envelope, https://github.com/secure-systems-lab/dsse/blob/master/envelope.md):
``{"payloadType", "payload" (base64), "signatures": [{"keyid", "sig" (base64)}]}``, where each signature
is over the pre-authentication encoding ``PAE(type, payload) = "DSSEv1" SP len(type) SP type SP
len(payload) SP payload``, so neither the payload nor its type can be changed without breaking it.

Keys:

* the private key is a PEM file (PKCS#8 or the traditional OpenSSL form, unencrypted: ``openssl genpkey
  -algorithm ed25519``, ``openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256``), read from a
  file or from an environment variable that holds the PEM text, once, before the build's first step; the
  variable then leaves torchkiln's environment, and the file is masked in every build step's sandbox
  (torchkiln.build.sandbox), so only torchkiln's own signing code, in its own process, ever holds the key.
  Only the file's path or the variable's *name* is ever on a command line; the key never reaches argv, a
  log, a manifest or an image (errors name where it was read from, never what it holds);
* the public key is a PEM ``PUBLIC KEY`` (SubjectPublicKeyInfo): ``openssl pkey -pubout``;
* ``keyid`` is the hex sha256 of the public key's DER SubjectPublicKeyInfo: computable from the public key
  alone with any tool (``openssl pkey -pubin -outform DER | sha256sum``), so another verifier (e.g.
  securesystemslib, which matches signatures to keys by keyid) can be handed the same id.

ECDSA signatures are DER-encoded (as OpenSSL, sigstore and securesystemslib write them). Verification
tells apart the three ways a statement fails: no signature by the given key (a wrong key), a signature by
it that does not verify (the statement or the signature was changed after signing), and an envelope that
cannot be read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from torchkiln.errors import UsageError

PAYLOAD_TYPE = "application/vnd.in-toto+json"

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey

# What a key may be, as errors name it.
KEY_KINDS = "an unencrypted PEM private key: ed25519 or ECDSA P-256"
PUBLIC_KINDS = "a PEM public key (openssl pkey -pubout): ed25519 or ECDSA P-256"


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "payloadType": self.payload_type,
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "signatures": [
                {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")} for s in self.signatures
            ],
        }

    def to_line(self) -> str:
        """One line of JSON (the ``.intoto.jsonl`` convention: one envelope per line)."""
        return json.dumps(self.to_data(), separators=(",", ":")) + "\n"


@dataclass(frozen=True)
class Verdict:
    """Whether an envelope is signed by a key: ``status`` is one of :data:`VERDICTS`."""

    status: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "signed"


# signed: a signature by the key verifies; wrong_key: no signature carries the key's id; bad_signature: the
# key's signature does not verify over this payload (the statement or the signature was changed).
VERDICTS = ("signed", "wrong_key", "bad_signature")


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def keyid(key: PublicKey) -> str:
    """Hex sha256 of the public key's DER SubjectPublicKeyInfo."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _checked_private(key: object, where: str) -> PrivateKey:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    raise UsageError(f"{where}: not a key torchkiln signs with (valid: {KEY_KINDS})")


def _parse_private(data: bytes, where: str) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise UsageError(f"{where}: the key is encrypted (valid: {KEY_KINDS})") from None
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"{where}: not a PEM private key (valid: {KEY_KINDS})") from None
    return _checked_private(key, where)


def load_signing_key(
    *, file: str | None, env_name: str | None, environ: Mapping[str, str] | None = None
) -> PrivateKey | None:
    """The private key named by a file path or an environment variable's name; None when neither is given.

    Read once: a variable read from this process's own environment (``environ`` not given) is removed from
    it once the key is parsed, so that no process torchkiln starts afterwards inherits it (the build
    steps, the compiler cache's server, git). A named variable that is unset or empty, an unreadable file,
    and a key of another kind are usage errors naming ``--sign-key-env NAME`` or ``--sign-key-file PATH``,
    never the key."""
    own = environ is None
    environ = os.environ if environ is None else environ
    if file and env_name:
        raise UsageError(
            "--sign-key-file and --sign-key-env: give one of them (the key from a file or a variable)"
        )
    if env_name:
        value = environ.get(env_name, "")
        if not value.strip():
            raise UsageError(
                f"--sign-key-env {env_name}: the environment variable is not set or empty "
                f"(valid: a variable holding {KEY_KINDS})"
            )
        key = _parse_private(value.encode("utf-8"), f"--sign-key-env {env_name}")
        if own:
            os.environ.pop(env_name, None)
        return key
    if file:
        path = Path(os.path.expanduser(file))
        return _parse_private(_read(path, "--sign-key-file", KEY_KINDS), f"--sign-key-file {path}")
    return None


def _read(path: Path, option: str, valid: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file (valid: {valid})") from None
    except IsADirectoryError:
        raise UsageError(f"{option} {path}: is a directory (valid: {valid})") from None
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot read: {exc.strerror}") from None


def parse_public_key(data: bytes, where: str) -> PublicKey:
    """A PEM public key of a kind torchkiln signs with; UsageError naming ``where`` otherwise."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise UsageError(f"{where}: not a PEM public key (valid: {PUBLIC_KINDS})") from None
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    raise UsageError(f"{where}: not a key torchkiln verifies with (valid: {PUBLIC_KINDS})")


def load_public_key(path: Path, option: str = "--key") -> PublicKey:
    return parse_public_key(_read(path, option, PUBLIC_KINDS), f"{option} {path}")


def public_pem(key: PrivateKey | PublicKey) -> bytes:
    """The PEM public key of ``key`` (what a verifier is given)."""
    public = (
        key.public_key() if isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) else key
    )
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def sign(payload: bytes, key: PrivateKey, payload_type: str = PAYLOAD_TYPE) -> Envelope:
    """``payload`` in a DSSE envelope with one signature by ``key``."""
    message = pae(payload_type, payload)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        sig = key.sign(message)
    else:
        sig = key.sign(message, ec.ECDSA(hashes.SHA256()))
    return Envelope(payload_type, payload, (Signature(keyid(key.public_key()), sig),))


def _valid(key: PublicKey, sig: bytes, message: bytes) -> bool:
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(sig, message)
        else:
            key.verify(sig, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def verify(envelope: Envelope, key: PublicKey) -> Verdict:
    """Whether ``envelope`` carries a signature by ``key`` that verifies over its payload and type."""
    wanted = keyid(key)
    mine = [s for s in envelope.signatures if s.keyid == wanted]
    if not mine:
        ids = ", ".join(s.keyid[:16] for s in envelope.signatures) or "none"
        return Verdict(
            "wrong_key",
            f"not signed by the given key (keyid {wanted[:16]}...): the envelope's signatures are by {ids}",
        )
    message = pae(envelope.payload_type, envelope.payload)
    if any(_valid(key, s.sig, message) for s in mine):
        return Verdict("signed", f"signed by keyid {wanted[:16]}...")
    return Verdict(
        "bad_signature",
        f"the signature by keyid {wanted[:16]}... does not verify: the statement (or its signature) was "
        "changed after it was signed",
    )


def parse_envelope(text: str, where: str) -> Envelope:
    """The first envelope of a ``.intoto.jsonl`` file (or a plain JSON envelope); UsageError naming
    ``where`` and the field when it is not one."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        data = json.loads(lines[0] if len(lines) > 1 else text)
    except (ValueError, IndexError):
        raise UsageError(
            f"{where}: not a DSSE envelope (valid: the JSON envelope torchkiln build writes)"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"{where}: not a DSSE envelope (a JSON object with payloadType, payload, signatures)"
        )
    try:
        payload = base64.b64decode(str(data["payload"]), validate=True)
        kind = data["payloadType"]
        entries = data["signatures"]
        if not isinstance(kind, str) or not isinstance(entries, list):
            raise TypeError
        signatures = tuple(
            Signature(str(s.get("keyid", "")), base64.b64decode(str(s["sig"]), validate=True))
            for s in entries
        )
    except KeyError as exc:
        raise UsageError(f"{where}: {exc.args[0]}: missing (valid: a DSSE envelope)") from None
    except (TypeError, AttributeError, binascii.Error):
        raise UsageError(
            f"{where}: payload, payloadType or signatures is malformed (valid: a DSSE envelope: base64 "
            "payload and sig, a string payloadType, a list of signatures)"
        ) from None
    return Envelope(kind, payload, signatures)


def load_envelope(path: Path, option: str = "--provenance") -> Envelope:
    data = _read(path, option, "a .intoto.jsonl file torchkiln build wrote")
    return parse_envelope(data.decode("utf-8", "replace"), f"{option} {path}")
