"""Write ``DIR/manifest.json`` for upstream's torch and torchvision wheels in DIR (``nox -s reference``), and
with ``--sign KEYDIR`` a CycloneDX SBOM per wheel and a signed provenance statement over them.

The reference tier installs upstream's own wheels from these files and passes the manifest to ``torchkiln
verify --manifest``, so the provenance checks (versions, the commit each wheel's ``version.py`` records, the
wheel's sha256, the files it installs) run on real artifacts too. The manifest says the wheels were not built
by torchkiln (:func:`kit.dists.manifest_for_upstream`).

``--sign KEYDIR``: the SBOMs and the statement are made by the same code ``torchkiln build``'s publish step
runs (:func:`torchkiln.artifacts.sbom.write_wheel_sboms`, :func:`torchkiln.artifacts.provenance.statement`),
signed with an ed25519 key made for this run (``KEYDIR/reference.key``; its public half
``KEYDIR/reference.pub``), so ``verify --provenance --key`` checks its signature, its subjects and its
byproducts on upstream's real wheels. The statement's builder is this script, not torchkiln's build: it
vouches for which files were verified, not for how they were built.

Usage: python tests/kit/upstream_manifest.py RECIPE DIR [--sign KEYDIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kit package (kit.dists)

from kit.dists import manifest_for_upstream  # noqa: E402
from torchkiln.artifacts import provenance, sbom, signing  # noqa: E402
from torchkiln.artifacts.manifest import load_manifest  # noqa: E402
from torchkiln.recipe.loader import load_recipe  # noqa: E402

BUILDER_ID = "https://github.com/torchkiln/torchkiln/blob/main/tests/kit/upstream_manifest.py"


def sign(recipe_path: Path, dist: Path, manifest_path: Path, keydir: Path) -> Path:
    """SBOMs beside the wheels and ``dist/<recipe>.intoto.jsonl`` signed by a new key in ``keydir``."""
    recipe = load_recipe(recipe_path)
    manifest = load_manifest(manifest_path)
    sboms = sbom.write_wheel_sboms(dist, manifest, recipe)
    key = Ed25519PrivateKey.generate()
    keydir.mkdir(parents=True, exist_ok=True)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (keydir / "reference.key").write_bytes(private)
    (keydir / "reference.key").chmod(0o600)
    (keydir / "reference.pub").write_bytes(signing.public_pem(key))
    data = provenance.statement(
        manifest,
        parameters={"origin": "the package index (upstream's PyPI wheels)"},
        byproducts=[manifest_path, *sboms],
        builder_id=BUILDER_ID,
    )
    path = dist / provenance.statement_name(recipe.name)
    provenance.write_signed(path, data, key)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("recipe", type=Path)
    parser.add_argument("dist", type=Path)
    parser.add_argument("--sign", type=Path, metavar="KEYDIR")
    args = parser.parse_args(argv)
    manifest = manifest_for_upstream(
        load_recipe(args.recipe), args.dist, "the package index (upstream's PyPI wheels)"
    )
    print(manifest)
    if args.sign:
        print(sign(args.recipe, args.dist, manifest, args.sign))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
