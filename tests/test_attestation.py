"""SBOMs, provenance statements and their signatures (torchkiln.artifacts.sbom, .provenance, .signing;
torchkiln.verify.attestation), without a build: tiny wheels and manifests (tests/kit/dists.py), keys made here,
the host's real Debian libraries and dpkg database.

Signatures are checked by an independent DSSE implementation (securesystemslib's ``Envelope.verify``, with
the keyid computed here from the public key's DER), SBOMs by cyclonedx-python-lib's JSON-schema validator.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from kit import ROOT
from kit.dists import manifest_of, pip_install_target, tampered_copy, tiny_wheel
from securesystemslib.dsse import Envelope as SslibEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from torchkiln import cli
from torchkiln.artifacts import provenance, sbom, sbom_bundled, sbom_debian, signing
from torchkiln.artifacts.lockfile import SourceLock, Submodule
from torchkiln.artifacts.manifest import WheelRecord
from torchkiln.errors import UsageError
from torchkiln.host.toolchain import Tool, Toolchain
from torchkiln.recipe.loader import load_recipe
from torchkiln.verify import attestation

COMMIT = "a" * 40
SUB_COMMIT = "b" * 40


def pem(key: signing.PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def sslib_key(public_pem: bytes) -> SSlibKey:
    """securesystemslib's key for a PEM public key, its keyid computed here (sha256 of the DER SPKI)."""
    public = serialization.load_pem_public_key(public_pem)
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return SSlibKey.from_crypto(public, keyid=hashlib.sha256(der).hexdigest())  # type: ignore[arg-type]


def sslib_verify(line: str, public_pem: bytes) -> None:
    SslibEnvelope.from_dict(json.loads(line)).verify([sslib_key(public_pem)], 1)


KEYS = {
    "ed25519": ed25519.Ed25519PrivateKey.generate,
    "ecdsa-p256": lambda: ec.generate_private_key(ec.SECP256R1()),
}


@pytest.fixture
def built(tmp_path: Path) -> dict:
    """A dist/ with a tiny torch-named wheel (its version.py records COMMIT), its manifest, SBOM, statement."""
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = tiny_wheel(
        dist,
        "kiln_tiny",
        "2.13.0",
        requires=(
            "nvidia-cudnn-cu13==9.20.0.48",
            "numpy",
            "numpy<3; python_version >= '3.12'",  # a project twice, under another marker
            "triton==3.7.1; extra == 'triton'",
        ),
        files={"kiln_tiny_pkg/version.py": f"git_version = '{COMMIT}'\n"},
    )
    lock = SourceLock(
        "torch",
        "https://github.com/pytorch/pytorch.git",
        "v2.13.0",
        COMMIT,
        False,
        False,
        "/src/torch",
        submodules=[
            Submodule("third_party/pybind11", SUB_COMMIT, "https://github.com/pybind/pybind11.git", "ok")
        ],
    )
    chain = Toolchain(
        "3.11.7",
        {
            "g++": Tool("/usr/bin/c++", "12.2.0", "c++"),
            "nvcc": Tool("/usr/local/cuda/bin/nvcc", "13.0.48", "nvcc"),
        },
        cudnn="9.20.0",
        build_packages={"setuptools": "80.9.0", "cmake": "4.1.0"},
    )
    manifest = manifest_of([WheelRecord.of(wheel, "torch")], {"torch": lock}, chain)
    manifest_path = dist / "manifest.json"
    from torchkiln.artifacts.manifest import write_manifest

    write_manifest(manifest_path, manifest)
    recipe = load_recipe(ROOT / "recipes" / "torch-2.13-cu130-py312.toml")
    (sbom_path,) = sbom.write_wheel_sboms(dist, manifest, recipe)
    return {
        "dist": dist,
        "wheel": wheel,
        "manifest": manifest,
        "paths": [manifest_path, sbom_path],
        "sbom": sbom_path,
    }


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_signed_statement_verifies_here_and_with_securesystemslib(
    built: dict, kind: str, tmp_path: Path
) -> None:
    key = KEYS[kind]()
    data = provenance.statement(
        built["manifest"], parameters={"projects": ["torch"]}, byproducts=built["paths"]
    )
    path = built["dist"] / provenance.statement_name("r")
    provenance.write_signed(path, data, key)
    line = path.read_text()
    assert line.count("\n") == 1  # one envelope per line (.intoto.jsonl)
    public = signing.public_pem(key)
    sslib_verify(line, public)  # the independent implementation accepts it

    envelope = signing.load_envelope(path)
    assert signing.verify(envelope, signing.parse_public_key(public, "k")).status == "signed"
    statement = json.loads(envelope.payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    (subject,) = statement["subject"]
    assert subject["name"] == built["wheel"].name
    assert subject["digest"] == {"sha256": hashlib.sha256(built["wheel"].read_bytes()).hexdigest()}
    assert (
        subject["annotations"]["commit"] == COMMIT and subject["annotations"]["distribution"] == "kiln-tiny"
    )
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"]["recipe"]["digest"] == {"sha256": "ab" * 32}
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    assert deps["torch"]["uri"] == "git+https://github.com/pytorch/pytorch.git@v2.13.0"
    assert deps["torch"]["digest"] == {"gitCommit": COMMIT}
    assert deps["torch/third_party/pybind11"]["digest"] == {"gitCommit": SUB_COMMIT}
    assert deps["cmake"]["uri"] == "pkg:pypi/cmake@4.1.0"
    run = statement["predicate"]["runDetails"]
    assert run["metadata"]["startedOn"] == built["manifest"].started
    assert {b["name"] for b in run["byproducts"]} == {"manifest.json", built["sbom"].name}


def test_wrong_key_and_changed_statement_fail_by_name_here_and_with_securesystemslib(built: dict) -> None:
    key, other = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    data = provenance.statement(built["manifest"], parameters={}, byproducts=[])
    envelope = signing.sign(provenance.canonical(data), key)
    wrong = signing.verify(envelope, other.public_key())
    assert wrong.status == "wrong_key" and "not signed by the given key" in wrong.message
    with pytest.raises(VerificationError):
        sslib_verify(envelope.to_line(), signing.public_pem(other))

    forged = json.loads(envelope.payload)
    forged["subject"][0]["digest"]["sha256"] = "0" * 64  # a wheel swapped under the same signature
    changed = signing.Envelope(envelope.payload_type, provenance.canonical(forged), envelope.signatures)
    bad = signing.verify(changed, key.public_key())
    assert bad.status == "bad_signature" and "changed after it was signed" in bad.message
    with pytest.raises(VerificationError):
        sslib_verify(changed.to_line(), signing.public_pem(key))
    # PAE binds the type: in-toto's other accepted type, not the one signed over, does not verify
    retyped = signing.Envelope(
        "application/vnd.in-toto.provenance+json", envelope.payload, envelope.signatures
    )
    assert signing.verify(retyped, key.public_key()).status == "bad_signature"
    generic = signing.Envelope("application/json", envelope.payload, envelope.signatures)
    assert signing.verify(generic, key.public_key()).status == "wrong_type"


@pytest.mark.integration  # real pip installs and fresh interpreters: about 10 s
def test_installed_subjects_pass_and_a_tampered_install_fails_by_name(built: dict, tmp_path: Path) -> None:
    """The subject checks on a real pip installation (--target): the genuine wheel passes; one whose
    module was changed (RECORD rewritten to match, so pip takes it) fails sha256 and files, naming it."""
    key = ed25519.Ed25519PrivateKey.generate()
    data = provenance.statement(built["manifest"], parameters={}, byproducts=built["paths"])
    path = built["dist"] / "r.intoto.jsonl"
    envelope = provenance.write_signed(path, data, key)
    good = tmp_path / "good"
    pip_install_target(good, built["wheel"])
    results = _checks_in(good, envelope, key, built["dist"])
    assert {k: c.status for k, c in results.items()} == {
        "signature": "pass",
        "kiln-tiny.version": "pass",
        "kiln-tiny.commit": "pass",
        "kiln-tiny.wheel_sha256": "pass",
        "kiln-tiny.files": "pass",
        "byproducts": "pass",
    }

    tampered = tmp_path / "tampered" / built["wheel"].name
    tampered.parent.mkdir()
    tampered_copy(built["wheel"], tampered, "kiln_tiny.py", b"VERSION = 'evil'\n")
    bad = tmp_path / "bad"
    pip_install_target(bad, tampered)
    results = _checks_in(bad, envelope, key, built["dist"])
    assert results["signature"].status == "pass"
    assert results["kiln-tiny.wheel_sha256"].status == "fail"
    assert f"subject {built['wheel'].name}" in results["kiln-tiny.wheel_sha256"].message
    assert (
        results["kiln-tiny.files"].status == "fail"
        and "the statement's" in results["kiln-tiny.files"].message
    )

    built["sbom"].write_text(built["sbom"].read_text() + " ")  # a byproduct changed after signing
    assert _checks_in(good, envelope, key, built["dist"])["byproducts"].status == "fail"


def _checks_in(site: Path, envelope: signing.Envelope, key: signing.PrivateKey, dist: Path) -> dict:
    """attestation_checks in a fresh interpreter that sees ``site`` (importlib.metadata caches nothing)."""
    code = (
        "import json, sys; from pathlib import Path\n"
        "from torchkiln.artifacts import signing; from torchkiln.verify import attestation\n"
        "env = signing.parse_envelope(sys.argv[1], 'statement'); key = signing.parse_public_key(sys.argv[2].encode(), 'k')\n"
        "r = attestation.attestation_checks(env, key, 'statement', directory=Path(sys.argv[3]))\n"
        "print(json.dumps({k: [c.status, c.message] for k, c in r.items()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src")])}
    done = subprocess.run(
        [sys.executable, "-c", code, envelope.to_line(), signing.public_pem(key).decode(), str(dist)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    raw = json.loads(done.stdout.splitlines()[-1])
    return {k: attestation.Comparison(k, status, message) for k, (status, message) in raw.items()}


def test_the_wheel_sbom_is_valid_cyclonedx_and_holds_what_the_build_knows(built: dict) -> None:
    text = built["sbom"].read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    root = doc["metadata"]["component"]
    assert root["name"] == "kiln-tiny" and root["version"] == "2.13.0"
    assert root["hashes"] == [{"alg": "SHA-256", "content": built["manifest"].wheels[0].sha256}]
    assert {"name": "torchkiln:commit", "value": COMMIT} in root["properties"]
    by_name = {c["name"]: c for c in doc["components"]}
    assert by_name["third_party/pybind11"]["version"] == SUB_COMMIT
    assert by_name["nvidia-cudnn-cu13"]["version"] == "9.20.0.48"
    assert by_name["nvidia-cudnn-cu13"]["purl"] == "pkg:pypi/nvidia-cudnn-cu13@9.20.0.48"
    assert by_name["triton"]["scope"] == "optional" and "version" not in by_name["numpy"]
    assert len([c for c in doc["components"] if c["name"] == "numpy"]) == 1  # once, with both lines
    assert sorted(p["value"] for p in by_name["numpy"]["properties"]) == [
        "numpy",
        "numpy<3; python_version >= '3.12'",
    ]
    # found by the build (toolchain) or pinned by the recipe (torch-2.13-cu130-py312)
    found = {
        n: (by_name[n]["version"], _props(by_name[n])["torchkiln:from"])
        for n in ("cuda-toolkit", "cudnn", "nccl", "mkl", "magma")
    }
    assert found == {
        "cuda-toolkit": ("13.0.48", "toolchain"),
        "cudnn": ("9.20.0", "toolchain"),
        "nccl": ("2.29.7", "recipe"),
        "mkl": ("2024.2.0", "recipe"),
        "magma": ("2.6.1", "recipe"),
    }
    assert by_name["g++"]["scope"] == "excluded" and _props(by_name["g++"])["torchkiln:role"] == "build-tool"
    assert by_name["setuptools"]["scope"] == "excluded"
    # the same build gives the same SBOM
    again = sbom.to_json(
        sbom.wheel_sbom(
            built["wheel"],
            built["manifest"].wheels[0],
            built["manifest"],
            load_recipe(ROOT / "recipes" / "torch-2.13-cu130-py312.toml"),
        )
    )
    assert again == text


def _props(component: dict) -> dict[str, str]:
    return {p["name"]: p["value"] for p in component.get("properties", [])}


HOST_LIB = Path("/usr/lib/x86_64-linux-gnu")
needs_dpkg = pytest.mark.skipif(
    (shutil.which("dpkg") is None or not (HOST_LIB / "libz.so.1").exists())
    and os.environ.get("CI") != "true",
    reason="needs a Debian host (dpkg, zlib1g)",
)


def dpkg_query(package: str, field: str) -> str:
    return subprocess.run(
        ["dpkg-query", "-W", "-f", f"${{{field}}}", package], capture_output=True, text=True, check=True
    ).stdout


@needs_dpkg
def test_a_bundled_library_is_traced_to_its_debian_package_version_and_licence(tmp_path: Path) -> None:
    """The host's real libz, copied into a wheel's .libs/ under bundle.py's hashed name: its SONAME is read
    from the ELF file, its origin found by that hash, dpkg names zlib1g at the installed version, and the
    copyright file's licence is Zlib."""
    real = (HOST_LIB / "libz.so.1").resolve()
    data = real.read_bytes()
    name = f"libz.{hashlib.sha256(data).hexdigest()[:8]}.so.1"
    wheel = tiny_wheel(tmp_path, "kiln_vision", "0.28.0")
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr(f"kiln_vision.libs/{name}", data)
        zf.writestr("kiln_vision.libs/libnothere.12345678.so.3", b"not an ELF file")
    (unknown, component) = sbom_bundled.bundled_components(wheel)  # sorted by name: libn... before libz...
    assert component.name == "zlib1g" and component.version == dpkg_query("zlib1g", "Version")
    assert [lic.id for lic in component.licenses] == ["Zlib"]  # type: ignore[union-attr]
    props = {p.name: p.value for p in component.properties}
    assert props["torchkiln:soname"] == "libz.so.1" and props["torchkiln:origin"] == str(real)
    assert props["torchkiln:debian:source"] == "zlib"
    assert component.purl is not None and (component.purl.type, component.purl.name) == ("deb", "zlib1g")
    assert component.purl.version == component.version and component.purl.qualifiers == {"arch": "amd64"}
    assert unknown.name == "libnothere.12345678.so.3"
    assert {p.value for p in unknown.properties if p.name == "torchkiln:origin-package"} == {
        "unknown on this host"
    }


@needs_dpkg
def test_elf_soname_and_debian_licences_read_real_files() -> None:
    assert sbom_bundled.elf_soname((HOST_LIB / "libz.so.1").resolve().read_bytes()) == "libz.so.1"
    assert sbom_bundled.elf_soname(Path(sys.executable).resolve().read_bytes()[:64]) is None
    text = Path("/usr/share/doc/zlib1g/copyright").read_text()
    assert sbom_debian.debian_licences(text) == ["Zlib"]


@pytest.mark.integration  # about 25 s: every package's copyright file and the venv's metadata
@needs_dpkg
def test_the_image_sbom_lists_every_installed_debian_package_and_the_venvs_distributions(
    tmp_path: Path,
) -> None:
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    out = tmp_path / "image.cdx.json"
    assert (
        sbom.main(["image", "--root", "/", "--site-packages", str(site), "--name", "test", "--out", str(out)])
        == 0
    )
    text = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    debs = {c["name"]: c for c in doc["components"] if c["purl"].startswith("pkg:deb/")}
    listed = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Package}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert set(debs) == {line.split()[1] for line in listed.splitlines() if line.startswith("installed ")}
    assert debs["zlib1g"]["version"] == dpkg_query("zlib1g", "Version")
    pythons = {c["name"]: c["version"] for c in doc["components"] if c["purl"].startswith("pkg:pypi/")}
    import cryptography
    import torch

    assert pythons["torch"] == torch.__version__ and pythons["cryptography"] == cryptography.__version__


def test_signing_keys_come_from_a_file_or_a_variable_and_errors_never_show_them(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    text = pem(key).decode()
    loaded = signing.load_signing_key(file=None, env_name="KILN_KEY", environ={"KILN_KEY": text})
    assert signing.keyid(loaded.public_key()) == signing.keyid(key.public_key())  # type: ignore[union-attr]
    path = tmp_path / "key.pem"
    path.write_text(text)
    assert signing.load_signing_key(file=str(path), env_name=None) is not None
    assert signing.load_signing_key(file=None, env_name=None) is None

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"),
    )
    cases = {
        "unset": (
            {"env_name": "KILN_NOPE", "file": None},
            {},
            "KILN_NOPE: the environment variable is not set",
        ),
        "missing": ({"env_name": None, "file": str(tmp_path / "none.pem")}, {}, "none.pem: no such file"),
        "rsa": (
            {"env_name": "K", "file": None},
            {"K": pem(rsa_key).decode()},
            "not a key torchkiln signs with",
        ),
        "encrypted": ({"env_name": "K", "file": None}, {"K": encrypted.decode()}, "the key is encrypted"),
        "garbage": ({"env_name": "K", "file": None}, {"K": text[:60]}, "not a PEM private key"),
        "both": ({"env_name": "K", "file": str(path)}, {"K": text}, "give one of them"),
    }
    for case, (kwargs, environ, expected) in cases.items():
        with pytest.raises(UsageError) as caught:
            signing.load_signing_key(environ=environ, **kwargs)  # type: ignore[arg-type]
        message = str(caught.value)
        assert expected in message, case
        assert "PRIVATE KEY" not in message and text[40:80] not in message, case


def test_build_refuses_an_unusable_key_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "build",
            "torch-2.13-cpu-py311",
            "--workdir",
            str(tmp_path / "w"),
            "--dist",
            str(tmp_path / "d"),
            "--sign-key-env",
            "KILN_UNSET_KEY",
        ]
    )
    assert code == 2
    assert "--sign-key-env KILN_UNSET_KEY: the environment variable is not set" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "d").exists()


def test_verify_takes_provenance_and_key_together_and_refuses_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "key.pub"
    key.write_bytes(signing.public_pem(ed25519.Ed25519PrivateKey.generate()))
    statement = tmp_path / "s.intoto.jsonl"
    statement.write_text("{not json\n")
    assert cli.main(["verify", "--provenance", str(statement)]) == 2
    assert "--provenance FILE and --key PUB go together" in capsys.readouterr().err
    assert cli.main(["verify", "--provenance", str(statement), "--key", str(key)]) == 2
    err = capsys.readouterr().err
    assert f"--provenance {statement}: <envelope>: not JSON" in err and "rule envelope.json" in err
    statement.write_text(
        signing.Envelope(signing.PAYLOAD_TYPE, b"{}", (signing.Signature("", b""),)).to_line()
    )
    assert cli.main(["verify", "--provenance", str(statement), "--key", str(statement)]) == 2
    assert "not a PEM public key" in capsys.readouterr().err


def test_a_statement_that_is_not_torchkilns_is_named_by_field() -> None:
    bad = signing.Envelope(signing.PAYLOAD_TYPE, json.dumps({"_type": "x"}).encode(), ())
    with pytest.raises(
        UsageError,
        match=r"s: payload._type: 'x' is not Statement v1 \(valid: https://in-toto.io/Statement/v1; rule",
    ):
        provenance.read_statement(bad, "s")
    no_subject = {
        "_type": provenance.STATEMENT_TYPE,
        "predicateType": provenance.PREDICATE_TYPE,
        "subject": [{"name": "w"}],
    }
    with pytest.raises(UsageError, match=r"payload.subject\[0\].digest: missing .*rule subject.digest"):
        provenance.read_statement(
            signing.Envelope(signing.PAYLOAD_TYPE, json.dumps(no_subject).encode(), ()), "s"
        )


def test_the_runtime_image_build_args_carry_the_statement_and_refuse_a_wrong_key_before_building(
    built: dict,
) -> None:
    from torchkiln.errors import TorchkilnError
    from torchkiln.images.spec import provenance_args

    dist, manifest = built["dist"], built["manifest"]
    key = ed25519.Ed25519PrivateKey.generate()
    assert set(provenance_args(dist, manifest, None).values()) == {""}  # no statement: nothing to keep
    with pytest.raises(UsageError, match=r"--provenance-key: .*r.intoto.jsonl: no such file"):
        provenance_args(dist, manifest, key.public_key())
    data = provenance.statement(manifest, parameters={}, byproducts=built["paths"])
    path = dist / provenance.statement_name(manifest.recipe.name)
    provenance.write_signed(path, data, key)
    args = provenance_args(dist, manifest, key.public_key())
    assert args["KILN_PROVENANCE"] == path.name
    assert args["KILN_PROVENANCE_SHA256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert args["KILN_PROVENANCE_KEYID"] == signing.keyid(key.public_key())
    assert base64.b64decode(args["KILN_PROVENANCE_KEY"]) == key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    other = ed25519.Ed25519PrivateKey.generate().public_key()
    with pytest.raises(TorchkilnError, match="not signed by the given key"):
        provenance_args(dist, manifest, other)
