"""docker-bake.json (torchkiln.images.bake): a devel, wheels and runtime target per shipped recipe, generated as JSON
(which `docker buildx bake` reads natively), matching the Dockerfiles, current with the recipes, and no
recipe value read as an interpolation."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from kit import ROOT

from torchkiln import cli
from torchkiln.errors import RecipeError
from torchkiln.images.bake import BAKE_FILE, bake_document, bake_text, literal
from torchkiln.images.spec import devel_args, runtime_args
from torchkiln.recipe.loader import load_recipe, parse_recipe

RECIPES = ROOT / "recipes"
CPU = RECIPES / "torch-2.13-cpu-py311.toml"
CU130 = RECIPES / "torch-2.14-cu130-py312.toml"


def variant(path: Path, old: str, new: str) -> bytes:
    text = path.read_text()
    assert old in text, old
    return text.replace(old, new, 1).encode()


def shipped() -> dict[str, Any]:
    return bake_document([load_recipe(p) for p in sorted(RECIPES.glob("*.toml"))])


def image_recipes() -> list[Path]:
    """The shipped recipes every image is made for: not the aarch64 NVPL one, whose devel image cannot install
    NVPL (recipe.compat.image_problem; tests/test_images_platform.py)."""
    return [p for p in sorted(RECIPES.glob("*.toml")) if load_recipe(p).blas.kind != "nvpl"]


def test_a_target_per_recipe_and_flavour_with_the_images_build_args() -> None:
    recipes = image_recipes()
    doc = shipped()
    targets = doc["target"]
    assert len(targets) == 3 * len(recipes)
    assert [name for name in targets if "aarch64" in name] == [
        f"torch-2_13-cu130-py311-aarch64-openblas-{flavour}" for flavour in ("devel", "wheels", "runtime")
    ]
    cu130 = targets["torch-2_14-cu130-py312-devel"]
    assert cu130["tags"] == ["${REGISTRY}/torchkiln:2.14.0-cu130-devel"]
    assert cu130["args"] == devel_args(load_recipe(CU130))  # what `torchkiln images` passes, nothing escaped
    assert cu130["args"]["BASE_IMAGE"] == "ubuntu:24.04" and cu130["args"]["KILN_CUDA_FROM"] == "pypi"
    assert (
        targets["torch-2_14-cu126-py312-devel"]["args"]["BASE_IMAGE"]
        == "nvidia/cuda:12.6.3-devel-ubuntu24.04"
    )
    runtime = targets["torch-2_14-cu130-py312-runtime"]
    assert runtime["contexts"] == {"dist": "target:torch-2_14-cu130-py312-wheels", "recipe": "recipes"}
    assert runtime["args"] == runtime_args(load_recipe(CU130))  # from the recipe: no build happened yet
    assert runtime["labels"]["io.torchkiln.recipe"] == "torch-2.14-cu130-py312"
    assert "org.opencontainers.image.version" not in runtime["labels"]  # the runtime Dockerfile sets it
    assert runtime["target"] == "runtime" and runtime["dockerfile"] == "docker/Dockerfile.runtime"
    wheels = targets["torch-2_13-cpu-py311-wheels"]
    assert wheels["secret"] == ["id=cache_password,env=TORCHKILN_CACHE_PASSWORD"]
    assert wheels["output"] == ["type=local,dest=dist"] and "tags" not in wheels
    assert doc["variable"] == {"REGISTRY": {"default": "localhost"}}
    assert len(doc["group"]["devel"]["targets"]) == len(recipes)
    assert (
        doc["group"]["default"]["targets"]
        == doc["group"]["devel"]["targets"] + doc["group"]["runtime"]["targets"]
    )


def test_committed_bake_file_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    committed = ROOT / BAKE_FILE
    rc = cli.main(["images", "--bake", "--check", "--output", str(committed), "--recipes-dir", str(RECIPES)])
    assert rc == 0, capsys.readouterr().err
    assert not (ROOT / "docker-bake.hcl").exists()  # bake would merge a stale HCL file into the JSON one


def test_committed_bake_file_matches_the_dockerfiles() -> None:
    """Every target names a stage its Dockerfile has, passes only ARGs that Dockerfile declares, and every
    runtime target's dist context is a wheels target of the same file."""
    targets = json.loads((ROOT / BAKE_FILE).read_text())["target"]
    assert len(targets) == 3 * len(image_recipes())
    for name, body in targets.items():
        dockerfile = (ROOT / body["dockerfile"]).read_text()
        declared = set(re.findall(r"^ARG (\w+)", dockerfile, re.M))
        assert re.search(rf"^FROM \S+ AS {body['target']}$", dockerfile, re.M), name
        assert set(body["args"]) <= declared, (name, set(body["args"]) - declared)
        if body["target"] == "runtime":
            source = body["contexts"]["dist"].removeprefix("target:")
            assert targets[source]["target"] == "wheels"


def test_two_recipes_with_one_tag_are_refused() -> None:
    twin = parse_recipe(
        variant(CPU, 'name = "torch-2.13-cpu-py311"', 'name = "twin"'), "twin.toml", Path("twin.toml")
    )
    with pytest.raises(RecipeError, match="image tag 2.13.0-cpu-devel is also"):
        bake_document([load_recipe(CPU), twin])


def test_recipe_values_are_literals_not_templates() -> None:
    """Bake reads JSON strings as templates: a recipe value with ${...} or %{...} is written escaped, so it
    stays text; the registry variable in the tags is the one template. magma.url refuses '{' and '%' (a URL
    in its one form, issue 45), so the value is put into the parsed recipe: bake must not rely on that."""
    url = "https://icl.utk.edu/projectsfiles/magma/downloads/${oops}/%{x}magma-2.6.1.tar.gz"
    with pytest.raises(RecipeError, match="magma.url"):
        parse_recipe(
            variant(CU130, "magma-2.6.1.tar.gz", "${oops}/%{x}magma-2.6.1.tar.gz"), "e.toml", Path("e.toml")
        )
    parsed = parse_recipe(CU130.read_bytes(), "e.toml", Path("e.toml"))
    assert parsed.magma is not None
    recipe = dataclasses.replace(parsed, magma=dataclasses.replace(parsed.magma, url=url))
    text = bake_text([recipe])
    target = json.loads(text)["target"]["torch-2_14-cu130-py312-devel"]
    assert (
        target["args"]["KILN_MAGMA_URL"]
        == "https://icl.utk.edu/projectsfiles/magma/downloads/$${oops}/%%{x}magma-2.6.1.tar.gz"
    )
    assert "${oops}" not in text.replace("$${oops}", "")
    assert target["tags"] == ["${REGISTRY}/torchkiln:2.14.0-cu130-devel"]
    assert literal("a$b%c{d}") == "a$b%c{d}"  # only the two openers are special


def test_bake_writes_atomically_and_check_detects_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # --recipes-dir is written relative to the working directory
    out = tmp_path / "bake.json"
    assert cli.main(["images", "--bake", "--output", str(out), "--recipes-dir", str(RECIPES)]) == 0
    assert cli.main(["images", "--bake", "--check", "--output", str(out), "--recipes-dir", str(RECIPES)]) == 0
    assert json.loads(out.read_text()) == shipped()
    out.write_text(out.read_text().replace("ubuntu:24.04", "ubuntu:24.10"))
    capsys.readouterr()
    assert cli.main(["images", "--bake", "--check", "--output", str(out), "--recipes-dir", str(RECIPES)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["bake.json"]
