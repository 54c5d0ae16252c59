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

ECDSA signatures are DER-encoded (as OpenSSL, sigstore and securesystemslib write them).

Reading an envelope checks it as DSSE and in-toto say (:mod:`.intoto`: each departure fails naming its
rule). Verification tries the key on every signature: DSSE's ``keyid`` is an unauthenticated hint that must
not decide anything, so an empty one, or one computed another way (securesystemslib's own keyids), does not
stop a valid signature from verifying; the hint only words the failure: no signature names the key (a wrong
key), one names it and does not verify (the statement or the signature was changed after signing), or none
names any key (either of the two).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from torchkiln.errors import UsageError

from .intoto import PAYLOAD_TYPE as PAYLOAD_TYPE  # what build signs: the in-toto statement's type
from .intoto import PAYLOAD_TYPES, Signature, read_envelope
from .intoto import Envelope as Envelope  # the envelope this module signs and verifies

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey

# What a key may be, as errors name it.
KEY_KINDS = "an unencrypted PEM private key: ed25519 or ECDSA P-256"
PUBLIC_KINDS = "a PEM public key (openssl pkey -pubout): ed25519 or ECDSA P-256"


@dataclass(frozen=True)
class Verdict:
    """Whether an envelope is signed by a key: ``status`` is one of :data:`VERDICTS`."""

    status: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "signed"


# signed: a signature verifies with the key; wrong_key: none does, and every signature names another key;
# bad_signature: one names the key and does not verify (the statement or the signature was changed);
# unverified: none verifies and some name no key (either of the two); wrong_type: the payload is not an
# in-toto statement (checked before any signature); unsigned: the envelope carries no signature.
VERDICTS = ("signed", "wrong_key", "bad_signature", "unverified", "wrong_type", "unsigned")


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
    """Whether ``envelope`` is an in-toto envelope with a signature by ``key`` that verifies over PAE of its
    exact payload type and payload. Every signature is tried: the keyid hints only word a failure."""
    wanted = keyid(key)
    short = f"keyid {wanted[:16]}..."
    if envelope.payload_type not in PAYLOAD_TYPES:
        return Verdict(
            "wrong_type",
            f"payloadType {ascii(envelope.payload_type)} is not in-toto's ({' or '.join(PAYLOAD_TYPES)}): "
            "not an in-toto attestation, whatever signs it",
        )
    if not envelope.signatures:
        return Verdict("unsigned", "the envelope carries no signature")
    message = pae(envelope.payload_type, envelope.payload)
    for s in envelope.signatures:
        if _valid(key, s.sig, message):
            if s.keyid == wanted:
                return Verdict("signed", f"signed by {short}")
            hint = "no keyid" if not s.keyid else f"keyid {s.keyid[:16]}..., computed another way"
            return Verdict("signed", f"signed by the given key ({short}; the signature carries {hint})")
    others = sorted({s.keyid[:16] + "..." for s in envelope.signatures if s.keyid and s.keyid != wanted})
    unnamed = sum(1 for s in envelope.signatures if not s.keyid)
    if any(s.keyid == wanted for s in envelope.signatures):
        return Verdict(
            "bad_signature",
            f"the signature by {short} does not verify: the statement (or its signature) was changed after "
            "it was signed",
        )
    if not unnamed:
        return Verdict(
            "wrong_key",
            f"not signed by the given key ({short}): the envelope's signatures are by keyid "
            + ", ".join(others),
        )
    by = f"; the others name keyid {', '.join(others)}" if others else ""
    return Verdict(
        "unverified",
        f"no signature verifies with the given key ({short}): {unnamed} signature(s) name no key (keyid is "
        "an optional hint), so they are another key's, or the statement (or signature) was changed after "
        f"signing{by}",
    )


def parse_envelope(text: str, where: str) -> Envelope:
    """The first envelope of a ``.intoto.jsonl`` file (or a plain JSON envelope), checked as DSSE and in-toto
    say (:func:`torchkiln.artifacts.intoto.read_envelope`): a :class:`~.intoto.Departure` (a UsageError)
    naming ``where``, the field and the rule otherwise."""
    lines = [line for line in text.splitlines() if line.strip()]
    return read_envelope(lines[0] if len(lines) > 1 else text, where)


def load_envelope(path: Path, option: str = "--provenance") -> Envelope:
    data = _read(path, option, "a .intoto.jsonl file torchkiln build wrote")
    return parse_envelope(data.decode("utf-8", "replace"), f"{option} {path}")
