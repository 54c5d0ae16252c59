"""The provenance envelope and statement checked as DSSE and in-toto say (torchkiln.artifacts.intoto,
.signing, .provenance): a table of envelopes and statements mutated from a real signed one, each refused
naming its rule (or accepted where the specifications allow it), and securesystemslib's DSSE verifier as
the independent check.

Keys are made by ``openssl genpkey`` (ed25519 and ECDSA P-256), signatures are real. The table is generated
from the specifications' grammar: every rule of ``intoto.RULES`` has at least one case
(``test_every_rule_has_a_case``), the payload-type and base64 variants are derived from the valid values
(case, whitespace, look-alikes, alphabets, padding), and hypothesis adds arbitrary ones.

securesystemslib verifies the DSSE layer only (payload type, statement: no opinion). Where it has an opinion
the two agree, except three places where securesystemslib departs from DSSE, each named in the case:
``keyid`` missing (it requires one: its own docstring cites its issue #416), a keyid hint that names
another key (it matches keys by keyid: issue #416 again), and a value mixing the standard and URL-safe
base64 alphabets (it translates ``-_`` before validating, so it takes a value that is neither form).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kit.dists import manifest_of
from kit.imagekit import examples
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.signer import SSlibKey

from torchkiln.artifacts import intoto, provenance, signing
from torchkiln.artifacts.lockfile import SourceLock
from torchkiln.artifacts.manifest import WheelRecord
from torchkiln.errors import UsageError

WHEEL = "torch-2.13.0+cpu.kiln1-cp311-cp311-linux_x86_64.whl"


def openssl_key(directory: Path, kind: str) -> signing.PrivateKey:
    """A private key made by openssl genpkey, read as torchkiln build reads --sign-key-file."""
    path = directory / f"{kind}.pem"
    algorithm = ["-algorithm", "ed25519"] if kind == "ed25519" else ["-algorithm", "EC"]
    curve = [] if kind == "ed25519" else ["-pkeyopt", "ec_paramgen_curve:P-256"]
    subprocess.run(["openssl", "genpkey", *algorithm, *curve, "-out", str(path)], check=True)
    key = signing.load_signing_key(file=str(path), env_name=None)
    assert key is not None
    return key


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, signing.PrivateKey]:
    directory = tmp_path_factory.mktemp("keys")
    return {kind: openssl_key(directory, kind) for kind in ("ed25519", "ecdsa-p256", "other")}


def _signed_in_both_alphabets(data: dict, key: signing.PrivateKey) -> dict:
    """The envelope with a signature whose base64 has a '+' or '/', the letters the URL-safe alphabet
    changes (about one signature in 15 has neither). ECDSA signs afresh each time: signed again until one
    has; Ed25519 is deterministic: the payload gets a note that changes the signature, not the rules."""
    for attempt in range(200):
        if any(c in data["signatures"][0]["sig"] for c in "+/"):
            return data
        body = valid_statement()
        body["predicate"]["buildDefinition"]["externalParameters"]["options"]["notes"].append(str(attempt))
        data = envelope_data(provenance.canonical(body), key)
    raise AssertionError("no signature in 200 had a '+' or '/'")


def _sig_urlsafe(data: dict, key: signing.PrivateKey, other: Any) -> str:
    data = _signed_in_both_alphabets(data, key)
    data["signatures"][0]["sig"] = _urlsafe(data["signatures"][0]["sig"])
    return _dumps(data)


def valid_statement() -> dict[str, Any]:
    wheel = WheelRecord(WHEEL, "torch", "2.13.0+cpu.kiln1", 1, "ab" * 32, "cd" * 32)
    lock = SourceLock(
        "torch", "https://github.com/pytorch/pytorch.git", "v2.13.0", "e" * 40, False, False, "/s"
    )
    # '???' and '~~~' are '/' and '+' in base64 at every offset: the payload uses both alphabets' letters
    parameters = {"notes": ["?" * 9 + "~" * 9]}
    data = provenance.statement(manifest_of([wheel], {"torch": lock}), parameters=parameters, byproducts=[])
    data["predicate"]["runDetails"]["metadata"]["invocationId"] = "kiln-test"  # the same payload every run
    return data


def envelope_data(payload: bytes, key: signing.PrivateKey, payload_type: str = signing.PAYLOAD_TYPE) -> dict:
    """A signed envelope as JSON data; signed over ``payload_type`` exactly (PAE)."""
    return signing.sign(payload, key, payload_type).to_data()


def sslib_accepts(data: Any, key: signing.PrivateKey, keyid: str | None = None) -> bool:
    """securesystemslib's verdict: its Envelope.from_dict + verify with the public key, whose keyid is the
    signature's hint (``keyid``) or torchkiln's."""
    public = key.public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    made = SSlibKey.from_crypto(public)  # type: ignore[arg-type]
    wanted = keyid if keyid is not None else hashlib.sha256(der).hexdigest()
    sslib_key = SSlibKey(wanted, made.keytype, made.scheme, made.keyval)
    try:
        SslibEnvelope.from_dict(copy.deepcopy(data)).verify([sslib_key], 1)
    except Exception:  # any refusal: KeyError, ValueError, binascii.Error, VerificationError, ...
        return False
    return True


def torchkiln_outcome(text: str, key: signing.PrivateKey) -> str:
    """The outcome: "accept", the rule of the departure, or the verdict's status."""
    try:
        envelope = signing.parse_envelope(text, "e")
    except intoto.Departure as exc:
        return exc.rule
    verdict = signing.verify(envelope, key.public_key())
    if not verdict.ok:
        return verdict.status
    try:
        provenance.read_statement(envelope, "e")
    except intoto.Departure as exc:
        return exc.rule
    return "accept"


@dataclass(frozen=True)
class Case:
    id: str
    # (a valid signed envelope's data, the signing key, the other key) -> the envelope's text
    make: Callable[[dict, signing.PrivateKey, signing.PrivateKey], str]
    expect: str  # "accept", a rule of intoto.RULES, or a verdict status
    # securesystemslib: "agree" (same accept/refuse), "no-opinion" (a layer it does not check: it accepts), or
    # why it departs from DSSE here
    sslib: str = "agree"
    sslib_keyid: str | None = None  # the keyid its key carries (None: torchkiln's)


def _dumps(data: Any) -> str:
    return json.dumps(data)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict, Any, Any], str]:
    def make(data: dict, key: Any, other: Any) -> str:
        target = data
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        return _dumps(data)

    return make


def _drop(path: tuple[Any, ...]) -> Callable[[dict, Any, Any], str]:
    def make(data: dict, key: Any, other: Any) -> str:
        target = data
        for step in path[:-1]:
            target = target[step]
        del target[path[-1]]
        return _dumps(data)

    return make


def _edit_b64(path: tuple[Any, ...], edit: Callable[[str], str]) -> Callable[[dict, Any, Any], str]:
    def make(data: dict, key: Any, other: Any) -> str:
        target = data
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = edit(target[path[-1]])
        return _dumps(data)

    return make


def _resigned(
    statement: Callable[[dict], Any] | None = None, payload_type: str | None = None, raw: bytes | None = None
):
    """The envelope signed again over a changed statement (or raw payload bytes) or payload type."""

    def make(data: dict, key: signing.PrivateKey, other: Any) -> str:
        if raw is not None:
            payload = raw
        else:
            body = valid_statement()
            if statement is not None:
                body = statement(body) or body
            payload = provenance.canonical(body)
        return _dumps(
            envelope_data(payload, key, signing.PAYLOAD_TYPE if payload_type is None else payload_type)
        )

    return make


def _urlsafe(text: str) -> str:
    return text.replace("+", "-").replace("/", "_")


def _unpadded(text: str) -> str:
    """Its padding dropped (a value without padding, a 72-byte DER signature: its last character)."""
    return text.rstrip("=") if text.endswith("=") else text[:-1]


def _mixed(text: str) -> str:
    """The same bytes, one character in the URL-safe alphabet and the others in the standard one: neither
    form (the valid statement's payload has several '+' and '/', so one can change and others stay)."""
    at = min(i for i in (text.find("+"), text.find("/")) if i >= 0)
    mixed = text[:at] + {"+": "-", "/": "_"}[text[at]] + text[at + 1 :]
    assert any(c in mixed for c in "+/") and any(c in mixed for c in "-_"), text
    return mixed


# payload types derived from in-toto's: the cases a hand-written list would miss
def payload_type_variants() -> dict[str, str]:
    valid = signing.PAYLOAD_TYPE
    variants = {
        "generic-json": "application/json",
        "empty": "",
        "upper": valid.upper(),
        "title": valid.title(),
        "suffix-upper": valid.replace("+json", "+JSON"),
        "leading-space": " " + valid,
        "trailing-newline": valid + "\n",
        "trailing-nul": valid + "\0",
        "zero-width-space": valid.replace("in-toto", "in\u200b-toto"),
        "cyrillic-o": valid.replace("o", "\u043e", 1),
        "greek-omicron": valid.replace("to", "t\u03bf", 1),
        "fullwidth-plus": valid.replace("+", "\uff0b"),
        "other-vendor": "application/vnd.in-toto.spdx+json",
        "dsse-media-type": "application/vnd.in-toto.provenance+dsse",
        "uri-form": "https://in-toto.io/Statement/v1",
    }
    return variants


def statement_cases() -> list[Case]:
    def set_in(path: tuple[Any, ...], value: Any) -> Callable[[dict], dict]:
        def change(body: dict) -> dict:
            target = body
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = value
            return body

        return change

    def drop_in(path: tuple[Any, ...]) -> Callable[[dict], dict]:
        def change(body: dict) -> dict:
            target = body
            for step in path[:-1]:
                target = target[step]
            del target[path[-1]]
            return body

        return change

    subject = ("subject", 0)
    digest = (*subject, "digest")
    cases = [
        ("statement-not-json", None, b"not json", "statement.json"),
        ("statement-array", None, b"[]", "statement.json"),
        ("statement-latin1", None, b'{"_type": "\xe9"}', "statement.json"),
        ("statement-nan", None, b'{"_type": NaN}', "statement.json"),
        (
            "statement-duplicate-type",
            None,
            b'{"_type": "x", "_type": "https://in-toto.io/Statement/v1"}',
            "statement.duplicate_key",
        ),
        ("type-missing", drop_in(("_type",)), None, "statement._type"),
        ("type-v0.1", set_in(("_type",), "https://in-toto.io/Statement/v0.1"), None, "statement._type"),
        ("type-http", set_in(("_type",), "http://in-toto.io/Statement/v1"), None, "statement._type"),
        (
            "type-trailing-slash",
            set_in(("_type",), "https://in-toto.io/Statement/v1/"),
            None,
            "statement._type",
        ),
        ("subject-missing", drop_in(("subject",)), None, "subject.missing"),
        ("subject-empty", set_in(("subject",), []), None, "subject.type"),
        ("subject-object", set_in(("subject",), {"name": WHEEL}), None, "subject.type"),
        ("subject-item-string", set_in(subject, WHEEL), None, "subject.item"),
        ("subject-name-number", set_in((*subject, "name"), 5), None, "subject.name"),
        (
            "subject-name-twice",
            lambda b: b["subject"].append(copy.deepcopy(b["subject"][0])),
            None,
            "subject.name",
        ),
        ("digest-missing", drop_in(digest), None, "subject.digest"),
        ("digest-empty", set_in(digest, {}), None, "subject.digest"),
        ("digest-list", set_in(digest, ["ab" * 32]), None, "subject.digest"),
        ("sha256-upper", set_in((*digest, "sha256"), "AB" * 32), None, "subject.digest.value"),
        ("sha256-short", set_in((*digest, "sha256"), "ab" * 31), None, "subject.digest.value"),
        ("sha256-not-hex", set_in((*digest, "sha256"), "zz" * 32), None, "subject.digest.value"),
        ("sha256-number", set_in((*digest, "sha256"), 7), None, "subject.digest.value"),
        ("sha512-bad", set_in((*digest, "sha512"), "ab" * 32), None, "subject.digest.value"),
        ("only-sha512", set_in(digest, {"sha512": "ab" * 64}), None, "subject.digest.sha256"),
        ("only-unknown-algorithm", set_in(digest, {"somecoolhash": "x"}), None, "subject.digest.sha256"),
        ("predicate-type-missing", drop_in(("predicateType",)), None, "predicateType"),
        (
            "predicate-type-v0.2",
            set_in(("predicateType",), "https://slsa.dev/provenance/v0.2"),
            None,
            "predicateType",
        ),
        ("predicate-list", set_in(("predicate",), []), None, "predicate.type"),
        (
            "build-definition-missing",
            drop_in(("predicate", "buildDefinition")),
            None,
            "predicate.buildDefinition",
        ),
        (
            "build-type-missing",
            drop_in(("predicate", "buildDefinition", "buildType")),
            None,
            "predicate.buildDefinition",
        ),
        (
            "external-parameters-missing",
            drop_in(("predicate", "buildDefinition", "externalParameters")),
            None,
            "predicate.buildDefinition",
        ),
        (
            "builder-id-missing",
            drop_in(("predicate", "runDetails", "builder", "id")),
            None,
            "predicate.runDetails",
        ),
        ("run-details-missing", drop_in(("predicate", "runDetails")), None, "predicate.runDetails"),
        (
            "dependency-empty-descriptor",
            set_in(("predicate", "buildDefinition", "resolvedDependencies"), [{"name": "x"}]),
            None,
            "descriptor.minimum",
        ),
        (
            "byproduct-empty-descriptor",
            set_in(("predicate", "runDetails", "byproducts"), [{"name": "x"}]),
            None,
            "descriptor.minimum",
        ),
        # allowed: unknown fields are ignored; a second digest beside sha256; a subject without a name
        ("statement-extension-field", set_in(("x-kiln-extension",), {"a": 1}), None, "accept"),
        ("digest-with-sha512-too", set_in((*digest, "sha512"), "ab" * 64), None, "accept"),
        ("digest-with-unknown-too", set_in((*digest, "somecoolhash"), "x"), None, "accept"),
    ]
    out = []
    for name, change, raw, expect in cases:
        out.append(Case(f"statement:{name}", _resigned(statement=change, raw=raw), expect, "no-opinion"))
    return out


def envelope_cases() -> list[Case]:
    cases = [
        Case("valid", lambda d, k, o: _dumps(d), "accept"),
        Case("not-json", lambda d, k, o: "{not json", "envelope.json"),
        Case("json-array", lambda d, k, o: _dumps([d]), "envelope.json"),
        # a decoy first: json.loads (what hands securesystemslib its dict) keeps the last, in-toto's type, a
        # first-wins parser the decoy; the duplicate is invisible to securesystemslib
        Case(
            "duplicate-payload-type",
            lambda d, k, o: '{"payloadType": "application/json", ' + _dumps(d)[1:],
            "envelope.duplicate_key",
            "no-opinion",
        ),
        Case("payload-type-missing", _drop(("payloadType",)), "payloadType.missing"),
        Case("payload-type-number", _set(("payloadType",), 1), "payloadType.type"),
        Case("payload-type-null", _set(("payloadType",), None), "payloadType.type"),
        Case("payload-type-list", _set(("payloadType",), [signing.PAYLOAD_TYPE]), "payloadType.type"),
        Case("payload-missing", _drop(("payload",)), "payload.missing"),
        Case("payload-number", _set(("payload",), 5), "payload.type"),
        Case("payload-unpadded", _edit_b64(("payload",), _unpadded), "payload.base64"),
        Case("payload-extra-padding", _edit_b64(("payload",), lambda t: t + "="), "payload.base64"),
        Case("payload-newline", _edit_b64(("payload",), lambda t: t[:8] + "\n" + t[8:]), "payload.base64"),
        Case("payload-space", _edit_b64(("payload",), lambda t: t[:8] + " " + t[8:]), "payload.base64"),
        Case("payload-bang", _edit_b64(("payload",), lambda t: t[:8] + "!" + t[9:]), "payload.base64"),
        Case(
            "payload-non-ascii", _edit_b64(("payload",), lambda t: t[:8] + "\u00e9" + t[9:]), "payload.base64"
        ),
        Case(
            "payload-mixed-alphabets",
            _edit_b64(("payload",), _mixed),
            "payload.base64",
            "securesystemslib translates -_ to +/ before validating, so it takes a value in neither alphabet",
        ),
        Case("payload-urlsafe", _edit_b64(("payload",), _urlsafe), "accept"),
        Case("signatures-missing", _drop(("signatures",)), "signatures.missing"),
        Case("signatures-object", _set(("signatures",), {}), "signatures.type"),
        Case("signatures-string", _set(("signatures",), "sig"), "signatures.type"),
        Case("signatures-empty", _set(("signatures",), []), "signatures.empty"),
        Case("signature-string", _set(("signatures", 0), "sig"), "signature.type"),
        Case("sig-missing", _drop(("signatures", 0, "sig")), "sig.missing"),
        Case("sig-null", _set(("signatures", 0, "sig"), None), "sig.type"),
        Case("sig-unpadded", _edit_b64(("signatures", 0, "sig"), _unpadded), "sig.base64"),
        Case("sig-star", _edit_b64(("signatures", 0, "sig"), lambda t: "*" + t[1:]), "sig.base64"),
        Case("sig-urlsafe", _sig_urlsafe, "accept"),
        Case("sig-empty", _set(("signatures", 0, "sig"), ""), "bad_signature"),
        Case("keyid-number", _set(("signatures", 0, "keyid"), 5), "keyid.type"),
        Case("keyid-empty", _set(("signatures", 0, "keyid"), ""), "accept", sslib_keyid=""),
        Case(
            "keyid-missing",
            _drop(("signatures", 0, "keyid")),
            "accept",
            "securesystemslib requires a keyid (its Envelope.verify docstring: not DSSE compliant, its issue #416)",
        ),
        Case(
            "keyid-of-another-key",
            _set(("signatures", 0, "keyid"), "f" * 64),
            "accept",
            "securesystemslib matches keys by keyid (issue #416); DSSE: the hint MUST NOT decide",
        ),
        Case(
            "unknown-fields",
            lambda d, k, o: _dumps({**d, "x-extra": 1, "signatures": [{**d["signatures"][0], "x": 2}]}),
            "accept",
        ),
        # PAE binds the exact type and payload
        Case(
            "type-changed-after-signing",
            _set(("payloadType",), "application/vnd.in-toto.provenance+json"),
            "bad_signature",
        ),
        Case("generic-type-after-signing", _set(("payloadType",), "application/json"), "payloadType.value"),
        Case(
            "payload-changed-after-signing",
            _edit_b64(
                ("payload",),
                lambda t: base64.b64encode(base64.b64decode(t).replace(b"2.13.0", b"2.13.1")).decode(),
            ),
            "bad_signature",
        ),
        Case(
            "signed-by-another-key",
            lambda d, k, o: _dumps(envelope_data(base64.b64decode(d["payload"]), o)),
            "wrong_key",
        ),
        Case(
            "another-key-no-keyid",
            lambda d, k, o: _dumps(
                {
                    **(e := envelope_data(base64.b64decode(d["payload"]), o)),
                    "signatures": [{"sig": e["signatures"][0]["sig"], "keyid": ""}],
                }
            ),
            "unverified",
            sslib_keyid="",
        ),
        Case(
            "another-key-and-ours",
            lambda d, k, o: _dumps(
                {
                    **d,
                    "signatures": [
                        *envelope_data(base64.b64decode(d["payload"]), o)["signatures"],
                        *d["signatures"],
                    ],
                }
            ),
            "accept",
        ),
        Case(
            "other-in-toto-type-signed",
            _resigned(payload_type="application/vnd.in-toto.provenance+json"),
            "accept",
        ),
    ]
    for name, variant in payload_type_variants().items():
        # signed over the variant itself: the signature verifies (securesystemslib says so), the type does not
        cases.append(
            Case(f"payload-type:{name}", _resigned(payload_type=variant), "payloadType.value", "no-opinion")
        )
    return cases + statement_cases()


CASES = envelope_cases()


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa-p256"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_departure_fails_by_its_rule_and_securesystemslib_agrees_where_it_judges(
    case: Case, kind: str, keys: dict[str, signing.PrivateKey]
) -> None:
    key, other = keys[kind], keys["other"]
    text = case.make(envelope_data(provenance.canonical(valid_statement()), key), key, other)
    assert text != _dumps(envelope_data(provenance.canonical(valid_statement()), key)) or case.id == "valid"
    outcome = torchkiln_outcome(text, key)
    assert outcome == case.expect, f"{case.id}: {outcome}"
    if outcome in intoto.RULES:  # the message names the rule and the file
        with pytest.raises(UsageError, match=rf"^e: .*rule {outcome.replace('.', '[.]')}: "):
            envelope = signing.parse_envelope(text, "e")
            provenance.read_statement(envelope, "e")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    sslib = data is not None and sslib_accepts(data, key, case.sslib_keyid)
    if case.sslib == "agree":
        assert sslib == (outcome == "accept"), (
            f"{case.id}: securesystemslib {'accepts' if sslib else 'refuses'}"
        )
    elif case.sslib == "no-opinion":
        assert sslib, f"{case.id}: securesystemslib should verify the DSSE layer of a validly signed envelope"
    else:  # a named departure of securesystemslib from DSSE: it decides the other way
        assert sslib != (outcome == "accept"), f"{case.id}: {case.sslib}"


def test_every_rule_has_a_case() -> None:
    covered = {c.expect for c in CASES}
    assert set(intoto.RULES) <= covered, sorted(set(intoto.RULES) - covered)


def test_an_empty_keyid_is_never_reported_as_signatures_by_none(keys: dict[str, signing.PrivateKey]) -> None:
    """The issue's example: a valid signature with an empty keyid verifies; a foreign one says why it fails
    without claiming the envelope is signed by nobody."""
    key, other = keys["ed25519"], keys["other"]
    payload = provenance.canonical(valid_statement())
    ours = signing.sign(payload, key)
    blank = signing.Envelope(ours.payload_type, payload, (signing.Signature("", ours.signatures[0].sig),))
    verdict = signing.verify(blank, key.public_key())
    assert verdict.ok and "the signature carries no keyid" in verdict.message
    theirs = signing.sign(payload, other)
    foreign = signing.Envelope(
        theirs.payload_type, payload, (signing.Signature("", theirs.signatures[0].sig),)
    )
    verdict = signing.verify(foreign, key.public_key())
    assert verdict.status == "unverified" and "none" not in verdict.message
    assert "1 signature(s) name no key" in verdict.message


def test_the_generic_json_type_validly_signed_fails_verify_provenance_by_name(
    tmp_path: Path, keys: dict[str, signing.PrivateKey], capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's example through the command line: refused before the suite runs, naming payloadType."""
    from torchkiln import cli

    key = keys["ed25519"]
    statement = tmp_path / "r.intoto.jsonl"
    statement.write_text(
        _dumps(envelope_data(provenance.canonical(valid_statement()), key, "application/json"))
    )
    public = tmp_path / "k.pub"
    public.write_bytes(signing.public_pem(key))
    assert cli.main(["verify", "--provenance", str(statement), "--key", str(public)]) == 2
    err = capsys.readouterr().err
    assert f"--provenance {statement}: payloadType: 'application/json' is not in-toto's payload type" in err
    assert "rule payloadType.value" in err


# ------------------------------------------------------------------------------------------------------
# Arbitrary values (hypothesis): the rules hold beyond the table's cases.
# ------------------------------------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(kind=st.text(max_size=60).filter(lambda t: t not in intoto.PAYLOAD_TYPES))
def test_any_other_payload_type_validly_signed_is_refused_by_name(
    keys: dict[str, signing.PrivateKey], kind: str
) -> None:
    key = keys["ed25519"]
    data = envelope_data(provenance.canonical(valid_statement()), key, kind)
    assert sslib_accepts(data, key)  # the signature over PAE(kind, payload) is valid
    with pytest.raises(intoto.Departure) as caught:
        signing.parse_envelope(_dumps(data), "e")
    assert caught.value.rule == "payloadType.value"
    envelope = signing.Envelope(kind, base64.b64decode(data["payload"]), ())
    assert signing.verify(envelope, key.public_key()).status == "wrong_type"


@SETTINGS
@given(
    raw=st.binary(max_size=80), at=st.integers(min_value=0), junk=st.characters(exclude_categories=("Cs",))
)
def test_base64_both_alphabets_accepted_anything_else_refused_as_securesystemslib_does(
    raw: bytes, at: int, junk: str
) -> None:
    from securesystemslib._internal.utils import b64dec

    standard, urlsafe = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    assert intoto.decode_base64(standard) == raw == intoto.decode_base64(urlsafe) == b64dec(urlsafe)
    if standard.endswith("="):
        assert intoto.decode_base64(standard.rstrip("=")) is None
    if junk.isascii() and (junk.isalnum() or junk in "+/-_="):
        return
    broken = standard[: at % (len(standard) + 1)] + junk + standard[at % (len(standard) + 1) :]
    assert intoto.decode_base64(broken) is None
    with pytest.raises(ValueError):  # binascii.Error
        b64dec(broken)


@SETTINGS
@given(value=st.text(alphabet="0123456789abcdefABCDEFxyz", max_size=70))
def test_a_subject_sha256_is_accepted_exactly_when_it_is_64_lowercase_hex(value: str) -> None:
    body = valid_statement()
    body["subject"][0]["digest"]["sha256"] = value
    payload = provenance.canonical(body)
    ok = len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    if ok:
        assert intoto.read_statement_data(payload, "s")["subject"][0]["digest"]["sha256"] == value
    else:
        with pytest.raises(intoto.Departure) as caught:
            intoto.read_statement_data(payload, "s")
        assert caught.value.rule == "subject.digest.value"
