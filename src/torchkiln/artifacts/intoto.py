"""What the DSSE envelope and the in-toto Statement of a signed provenance must be, rule by rule.

Every rule below is one sentence of a specification, and a departure from it fails naming the rule
(:class:`Departure`: ``.rule``, and a message ``<file>: <field>: <what is wrong> (valid: ...)``):

* DSSE protocol v1.0.0 and envelope v1.0.2 (github.com/secure-systems-lab/dsse, protocol.md, envelope.md):
  ``payload``, ``payloadType``, ``signatures`` and each ``sig`` are REQUIRED, even if empty; ``keyid`` is
  OPTIONAL and unset means empty, an unauthenticated hint that "MUST NOT be used for security decisions";
  payload and sig are base64, "standard or URL-safe ... verifiers MUST accept either"; consumers MUST ignore
  unrecognized fields. Base64 is RFC 4648's, whose section 3.2 requires the padding unless the referring
  specification says otherwise (DSSE does not).
* in-toto attestation framework v1.1 (github.com/in-toto/attestation, spec/v1): the envelope's
  ``payloadType`` MUST be ``application/vnd.in-toto+json`` (or the predicate's own
  ``application/vnd.in-toto.<predicate>+json``: ``provenance`` for SLSA provenance), ``signatures`` MUST be
  an array, ``payload`` a base64-encoded JSON Statement (envelope.md); the Statement's ``_type`` is
  ``https://in-toto.io/Statement/v1``, ``subject`` an array whose every element MUST have ``digest`` set,
  ``predicateType`` a required URI, ``predicate`` an optional object (statement.md); a DigestSet's standard
  algorithms are lowercase hex, and consumers MUST ignore algorithms they do not accept (digest_set.md); a
  ResourceDescriptor MUST set one of ``uri``, ``digest``, ``content`` (resource_descriptor.md).
* SLSA provenance v1 (slsa.dev/spec/v1.0/provenance): ``buildDefinition`` with ``buildType`` and
  ``externalParameters``, and ``runDetails.builder.id``, are REQUIRED.
* JSON (RFC 8259 section 4): member names SHOULD be unique; parsers disagree on which duplicate wins, so a
  signed document with one could be read two ways: refused.

What torchkiln needs beyond the specifications is said where it applies: a subject's ``sha256`` (the only
algorithm it compares wheels with) and subject names unique (it matches wheels by name).

This module decodes and checks; :mod:`.signing` verifies signatures, :mod:`.provenance` reads the checked
statement into typed subjects.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchkiln.errors import UsageError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
# in-toto envelope.md also allows the predicate's own media type; SLSA provenance's spec file is provenance.md.
PAYLOAD_TYPES = (PAYLOAD_TYPE, "application/vnd.in-toto.provenance+json")
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"

DSSE = "DSSE envelope.md"
PROTOCOL = "DSSE protocol.md"
ENVELOPE = "in-toto envelope.md"
STATEMENT = "in-toto statement.md"
DIGESTS = "in-toto digest_set.md"
DESCRIPTOR = "in-toto resource_descriptor.md"
SLSA = "SLSA provenance v1"
JSON_RFC = "RFC 8259 section 4"

# rule -> where the specifications say it (each Departure names its rule; tests/test_envelope_rules.py has
# a generated case for every one)
RULES: dict[str, str] = {
    "envelope.json": f"the envelope is one JSON object ({DSSE})",
    "envelope.duplicate_key": f"no member name twice in one object ({JSON_RFC})",
    "payloadType.missing": f"payloadType is REQUIRED ({DSSE}, parsing rules)",
    "payloadType.type": f"payloadType is a string ({PROTOCOL})",
    "payloadType.value": f"payloadType MUST be application/vnd.in-toto+json ({ENVELOPE})",
    "payload.missing": f"payload is REQUIRED ({DSSE}, parsing rules)",
    "payload.type": f"payload is a base64 string ({DSSE})",
    "payload.base64": f"standard or URL-safe base64 with its padding ({PROTOCOL}; RFC 4648 section 3.2)",
    "signatures.missing": f"signatures is REQUIRED ({DSSE}, parsing rules)",
    "signatures.type": f"signatures MUST be an array ({ENVELOPE})",
    "signatures.empty": f"at least one signature: an envelope without one vouches for nothing ({PROTOCOL})",
    "signature.type": f"each signature is an object with sig and an optional keyid ({DSSE})",
    "sig.missing": f"signature.sig is REQUIRED ({DSSE}, parsing rules)",
    "sig.type": f"sig is a base64 string ({DSSE})",
    "sig.base64": f"standard or URL-safe base64 with its padding ({PROTOCOL}; RFC 4648 section 3.2)",
    "keyid.type": f"keyid, when set, is a string ({PROTOCOL})",
    "statement.json": f"payload MUST be a base64-encoded JSON Statement, an object in UTF-8 ({ENVELOPE})",
    "statement.duplicate_key": f"no member name twice in one object ({JSON_RFC})",
    "statement._type": f"_type is https://in-toto.io/Statement/v1 ({STATEMENT})",
    "subject.missing": f"subject is required ({STATEMENT})",
    "subject.type": f"subject is a non-empty array of ResourceDescriptors ({STATEMENT})",
    "subject.item": f"each subject is a ResourceDescriptor object ({STATEMENT})",
    "subject.name": f"a subject's name, when set, is a string, unique within subject ({STATEMENT})",
    "subject.digest": f"each subject MUST have digest set: a non-empty object ({STATEMENT})",
    "subject.digest.value": f"standard algorithms' digests are lowercase hex of their length ({DIGESTS})",
    "subject.digest.sha256": (
        f"torchkiln compares wheels by sha256 and MUST ignore algorithms it does not accept ({DIGESTS})"
    ),
    "predicateType": f"predicateType is https://slsa.dev/provenance/v1 ({STATEMENT}; {SLSA})",
    "predicate.type": f"predicate, when set, is an object ({STATEMENT})",
    "predicate.buildDefinition": f"buildDefinition with buildType and externalParameters is REQUIRED ({SLSA})",
    "predicate.runDetails": f"runDetails with builder.id is REQUIRED ({SLSA})",
    "descriptor.minimum": f"a ResourceDescriptor sets uri, digest or content ({DESCRIPTOR})",
}

# digest_set.md's standard algorithms and their hex lengths (gitCommit & co.: SHA-1 or SHA-256 objects)
HEX_LENGTHS: dict[str, tuple[int, ...]] = {
    "sha256": (64,),
    "sha224": (56,),
    "sha384": (96,),
    "sha512": (128,),
    "sha512_224": (56,),
    "sha512_256": (64,),
    "sha3_224": (56,),
    "sha3_256": (64,),
    "sha3_384": (96,),
    "sha3_512": (128,),
    "sha1": (40,),
    "md5": (32,),
    "ripemd160": (40,),
    "sm3": (64,),
    "gitCommit": (40, 64),
    "gitTree": (40, 64),
    "gitBlob": (40, 64),
    "gitTag": (40, 64),
}
_HEX = re.compile(r"[0-9a-f]+")
_B64_STANDARD = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_B64_URLSAFE = re.compile(r"(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?")


class Departure(UsageError):
    """An envelope or statement that is not what the specifications say: ``rule`` names the rule
    (:data:`RULES`), the message the file, the field, what is wrong and what is valid."""

    def __init__(self, where: str, rule: str, field: str, problem: str, valid: str) -> None:
        self.rule = rule
        self.field = field
        super().__init__(f"{where}: {field}: {problem} (valid: {valid}; rule {rule}: {RULES[rule]})")


@dataclass(frozen=True)
class Signature:
    keyid: str  # "" when unset: an unauthenticated hint
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    """A DSSE envelope: what ``torchkiln build`` signs (artifacts.signing) and what it reads back."""

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


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    """``json.loads`` refusing duplicate member names (:class:`_Duplicate`) and NaN/Infinity (ValueError)."""
    return json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)


def decode_base64(text: str) -> bytes | None:
    """Standard or URL-safe base64 with its padding (one alphabet per value); None when it is neither."""
    if _B64_STANDARD.fullmatch(text):
        return base64.b64decode(text, validate=True)
    if _B64_URLSAFE.fullmatch(text):
        return base64.urlsafe_b64decode(text)
    return None


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}
    return kinds.get(type(value), "an object" if isinstance(value, dict) else type(value).__name__)


def _base64_field(data: Mapping[str, Any], key: str, field: str, where: str, rule: str) -> bytes:
    if key not in data:
        raise Departure(
            where, f"{rule}.missing", field, "missing", "a base64 string (REQUIRED, even if empty)"
        )
    value = data[key]
    if not isinstance(value, str):
        raise Departure(where, f"{rule}.type", field, f"{_describe(value)}, not a string", "a base64 string")
    decoded = decode_base64(value)
    if decoded is None:
        raise Departure(
            where,
            f"{rule}.base64",
            field,
            f"not base64 ({_why_not_base64(value)})",
            "standard (+/) or URL-safe (-_) base64 of RFC 4648, padded with = to a multiple of 4",
        )
    return decoded


def _why_not_base64(text: str) -> str:
    stray = sorted({c for c in text if not (c.isascii() and (c.isalnum() or c in "+/-_="))})
    if stray:
        return "characters outside the alphabet: " + ", ".join(repr(c) for c in stray[:5])
    if ("+" in text or "/" in text) and ("-" in text or "_" in text):
        return "the standard and URL-safe alphabets mixed"
    if len(text.rstrip("=")) % 4 and len(text) % 4:
        return "its padding is missing"
    return "misplaced padding"


def _json_object(
    text: str | bytes, where: str, rule: str, whole: str, members: str, valid: str
) -> dict[str, Any]:
    """The JSON object ``text`` holds (bytes: in UTF-8), read strictly (:func:`strict_json`); else a
    :class:`Departure` of rule ``{rule}.json`` naming ``whole``, or ``{rule}.duplicate_key`` naming the member
    (``members`` before its name). ``valid``: what the text should be."""
    try:
        data = strict_json(text if isinstance(text, str) else text.decode("utf-8"))
    except _Duplicate as dup:
        raise Departure(
            where, f"{rule}.duplicate_key", f"{members}{dup.key}", "given twice", "each member once"
        ) from None
    except ValueError:  # UnicodeDecodeError too
        found = "not JSON" if isinstance(text, str) else "not JSON in UTF-8"
        raise Departure(where, f"{rule}.json", whole, found, valid) from None
    if not isinstance(data, dict):
        raise Departure(where, f"{rule}.json", whole, f"{_describe(data)}, not an object", "a JSON object")
    return data


def read_envelope(text: str, where: str) -> Envelope:
    """The DSSE envelope ``text`` holds, decoded; :class:`Departure` naming the first rule it breaks. The
    payload type is checked here too: an envelope of another type is no in-toto attestation, whoever
    signed it (DSSE: "Reject if PAYLOAD_TYPE is not a supported type")."""
    data = _json_object(text, where, "envelope", "<envelope>", "", "the JSON envelope torchkiln build writes")
    if "payloadType" not in data:
        raise Departure(where, "payloadType.missing", "payloadType", "missing", PAYLOAD_TYPE)
    kind = data["payloadType"]
    if not isinstance(kind, str):
        raise Departure(
            where, "payloadType.type", "payloadType", f"{_describe(kind)}, not a string", PAYLOAD_TYPE
        )
    check_payload_type(kind, where)
    payload = _base64_field(data, "payload", "payload", where, "payload")
    if "signatures" not in data:
        raise Departure(where, "signatures.missing", "signatures", "missing", "an array of signatures")
    entries = data["signatures"]
    if not isinstance(entries, list):
        raise Departure(
            where,
            "signatures.type",
            "signatures",
            f"{_describe(entries)}, not an array",
            "an array of signatures",
        )
    if not entries:
        raise Departure(where, "signatures.empty", "signatures", "empty", "at least one signature")
    return Envelope(kind, payload, tuple(_signature(e, i, where) for i, e in enumerate(entries)))


def _signature(entry: Any, index: int, where: str) -> Signature:
    field = f"signatures[{index}]"
    if not isinstance(entry, dict):
        raise Departure(
            where, "signature.type", field, f"{_describe(entry)}, not an object", '{"keyid": ..., "sig": ...}'
        )
    sig = _base64_field(entry, "sig", f"{field}.sig", where, "sig")
    keyid = entry.get("keyid")
    if keyid is not None and not isinstance(keyid, str):
        raise Departure(
            where, "keyid.type", f"{field}.keyid", f"{_describe(keyid)}, not a string", "a string, or unset"
        )
    return Signature(keyid or "", sig)


def check_payload_type(kind: str, where: str) -> None:
    """DSSE's payload type is opaque and case-sensitive: only in-toto's exact types pass."""
    if kind in PAYLOAD_TYPES:
        return
    shown = ascii(kind)
    hint = ""
    if kind.strip().lower() in PAYLOAD_TYPES or kind.strip() in PAYLOAD_TYPES:
        hint = ": payload types are compared exactly (case-sensitive, no spaces)"
    elif not kind.isascii():
        hint = ": it holds characters outside ASCII (look-alikes of in-toto's)"
    raise Departure(
        where,
        "payloadType.value",
        "payloadType",
        f"{shown} is not in-toto's payload type{hint}",
        " or ".join(PAYLOAD_TYPES),
    )


def read_statement_data(payload: bytes, where: str) -> dict[str, Any]:
    """The in-toto Statement v1 with a SLSA provenance v1 predicate ``payload`` holds, checked rule by rule;
    :class:`Departure` naming the first rule it breaks. Unknown fields are ignored, as the framework says."""
    data = _json_object(payload, where, "statement", "payload", "payload.", "an in-toto Statement")
    if data.get("_type") != STATEMENT_TYPE:
        found = "missing" if "_type" not in data else f"{ascii(data['_type'])} is not Statement v1"
        raise Departure(where, "statement._type", "payload._type", found, STATEMENT_TYPE)
    _subjects(data, where)
    if data.get("predicateType") != PREDICATE_TYPE:
        found = "missing" if "predicateType" not in data else f"{ascii(data['predicateType'])} is not it"
        raise Departure(where, "predicateType", "payload.predicateType", found, PREDICATE_TYPE)
    _predicate(data.get("predicate"), where)
    return data


def _subjects(data: Mapping[str, Any], where: str) -> None:
    if "subject" not in data:
        raise Departure(where, "subject.missing", "payload.subject", "missing", "the wheels the build made")
    items = data["subject"]
    if not isinstance(items, list) or not items:
        found = "empty" if isinstance(items, list) else f"{_describe(items)}, not an array"
        raise Departure(where, "subject.type", "payload.subject", found, "a non-empty array")
    names: set[str] = set()
    for index, item in enumerate(items):
        field = f"payload.subject[{index}]"
        if not isinstance(item, dict):
            raise Departure(
                where, "subject.item", field, f"{_describe(item)}, not an object", "a ResourceDescriptor"
            )
        name = item.get("name")
        if name is not None and (not isinstance(name, str) or name in names):
            problem = "given twice" if isinstance(name, str) else f"{_describe(name)}, not a string"
            raise Departure(where, "subject.name", f"{field}.name", problem, "a wheel's file name, once")
        names.add(name or "")
        _subject_digest(item.get("digest"), f"{field}.digest", where)


def _subject_digest(digest: Any, field: str, where: str) -> None:
    if not isinstance(digest, dict) or not digest:
        found = "missing" if digest is None else ("empty" if digest == {} else f"{_describe(digest)}")
        raise Departure(where, "subject.digest", field, found, '{"sha256": "<64 lowercase hex>"}')
    for algorithm, value in digest.items():
        lengths = HEX_LENGTHS.get(algorithm)
        if not isinstance(value, str) or not value:
            raise Departure(
                where,
                "subject.digest.value",
                f"{field}.{algorithm}",
                f"{_describe(value)}",
                "a non-empty string",
            )
        if lengths and not (_HEX.fullmatch(value) and len(value) in lengths):
            raise Departure(
                where,
                "subject.digest.value",
                f"{field}.{algorithm}",
                f"{ascii(value[:80])} is not {algorithm}'s lowercase hex",
                f"{' or '.join(map(str, lengths))} characters 0-9a-f",
            )
    if "sha256" not in digest:
        raise Departure(
            where,
            "subject.digest.sha256",
            field,
            f"no sha256 (only {', '.join(sorted(digest))})",
            "a sha256 among the digests",
        )


def _predicate(predicate: Any, where: str) -> None:
    if predicate is not None and not isinstance(predicate, dict):
        raise Departure(where, "predicate.type", "payload.predicate", f"{_describe(predicate)}", "an object")
    predicate = predicate or {}
    build = predicate.get("buildDefinition")
    if not isinstance(build, dict) or not isinstance(build.get("buildType"), str):
        raise Departure(
            where,
            "predicate.buildDefinition",
            "payload.predicate.buildDefinition.buildType",
            "missing",
            "the build type's URI",
        )
    if not isinstance(build.get("externalParameters"), dict):
        raise Departure(
            where,
            "predicate.buildDefinition",
            "payload.predicate.buildDefinition.externalParameters",
            "missing or not an object",
            "an object",
        )
    run = predicate.get("runDetails")
    builder = run.get("builder") if isinstance(run, dict) else None
    if not isinstance(builder, dict) or not isinstance(builder.get("id"), str) or not builder["id"]:
        raise Departure(
            where,
            "predicate.runDetails",
            "payload.predicate.runDetails.builder.id",
            "missing",
            "the builder's URI",
        )
    for name, items in (
        ("buildDefinition.resolvedDependencies", build.get("resolvedDependencies")),
        ("runDetails.byproducts", run.get("byproducts") if isinstance(run, dict) else None),
    ):
        for index, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict) or not any(k in item for k in ("uri", "digest", "content")):
                raise Departure(
                    where,
                    "descriptor.minimum",
                    f"payload.predicate.{name}[{index}]",
                    "sets none of uri, digest, content",
                    "a ResourceDescriptor with one of them",
                )
