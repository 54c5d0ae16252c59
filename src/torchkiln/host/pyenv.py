"""Which Pythons a pyenv installs: so that a fix offers ``pyenv install X.Y`` only where it installs a release.

``pyenv install 3.14`` takes the newest definition of a 3.14 release that pyenv's python-build has (``pyenv
latest -k 3.14``: libexec/pyenv-latest leaves out the -dev and -src definitions and the a/b/rc prereleases)
and fails where there is none: Debian 13's pyenv 2.5.4 has 3.14.0a6 and 3.14-dev only. A free-threaded
``3.14t`` takes the newest 3.14.Nt. (pyenv-latest's prerelease filter misses a name ending in ``t``, so 2.5.4
takes the alpha 3.14.0a6t for ``3.14t``: not a release, so never offered here.)

Two sources: the definitions of a pyenv on this machine (its python-build plugin's share/python-build/, the
directory ``python-build --definitions`` lists), and for a pyenv not installed yet data/distros.toml's
``[pyenv."VERSION"]`` tables (what Debian's packages and upstream's newest release ship).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from torchkiln.shipped import shipped_toml

# A definition of a release: 3.14.5, 3.14.5t (not 3.14.0a6, 3.14.0rc1t, 3.14-dev, 3.14t-dev).
RELEASE = re.compile(r"(\d+\.\d+)\.\d+(t?)")
# Where python-build keeps its definitions, under a pyenv's own directory (a git clone, or Debian's
# /usr/share/pyenv): the pyenv executable is its libexec/pyenv (bin/pyenv links there).
DEFINITIONS = Path("plugins") / "python-build" / "share" / "python-build"


@dataclass(frozen=True)
class Release:
    """A pyenv release of data/distros.toml: the Pythons it installs, and what Debian's package of it does."""

    version: str
    pythons: frozenset[str]
    profile_root: str | None = None  # the PYENV_ROOT Debian's /etc/profile.d/pyenv.sh sets for login shells
    upstream: bool = False  # upstream's newest release read (not a distribution's package)


@cache
def known() -> dict[str, Release]:
    """data/distros.toml's ``[pyenv."VERSION"]`` tables, by version."""
    return {
        version: Release(
            version,
            frozenset(row["pythons"]),
            row.get("profile_root"),
            bool(row.get("upstream", False)),
        )
        for version, row in shipped_toml("distros.toml")["pyenv"].items()
    }


def upstream() -> Release:
    """Upstream's newest pyenv release read: what pyenv's installer installs (at least)."""
    return next(r for r in known().values() if r.upstream)


def releases_in(names: Iterable[str]) -> frozenset[str]:
    """``X.Y`` (``X.Yt``) for every definition of a release ``X.Y.N`` (``X.Y.Nt``) among ``names``."""
    return frozenset(m.group(1) + m.group(2) for n in names if (m := RELEASE.fullmatch(n)))


def home_of(executable: str) -> Path:
    """The directory of the pyenv whose executable is ``executable`` (a link to its libexec/pyenv)."""
    return Path(os.path.realpath(executable)).parent.parent


def installs(home: Path) -> frozenset[str] | None:
    """The Pythons the pyenv in ``home`` installs, from its definitions; None where they cannot be read
    (no python-build plugin there: pyenv install is another package's, or a plugin of PYENV_ROOT)."""
    try:
        return releases_in(p.name for p in (home / DEFINITIONS).iterdir())
    except OSError:
        return None
