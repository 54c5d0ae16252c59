"""Write ``DIR/manifest.json`` for upstream's torch and torchvision wheels in DIR (``nox -s reference``).

The reference tier installs upstream's own wheels from these files and passes the manifest to ``torchkiln
verify --manifest``, so the provenance checks (versions, the commit each wheel's ``version.py`` records, the
wheel's sha256, the files it installs) run on real artifacts too. The manifest says the wheels were not built
by torchkiln (:func:`dists.manifest_for_upstream`).

Usage: python tests/reference/upstream_manifest.py RECIPE DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the dists helper

from dists import manifest_for_upstream  # noqa: E402

from torchkiln.recipe.loader import load_recipe  # noqa: E402


def main(argv: list[str]) -> int:
    recipe, dist = Path(argv[0]), Path(argv[1])
    print(manifest_for_upstream(load_recipe(recipe), dist, "the package index (upstream's PyPI wheels)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
