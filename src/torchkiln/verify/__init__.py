"""Pure-Python support for the verification suite in ``verify/``.

The suite runs inside slim runtime images that hold torch, pytest and torchkiln's pure-Python core, so
nothing here imports the build machinery (git, compilers, caches, images), rich, or torch at module load:
functions that need torch import it when called.

* :mod:`.buildconfig`: parse ``torch.__config__.show()``, collect build facts, compare them with a recipe;
  each library's checks in :mod:`.buildconfig_versions`, :mod:`.buildconfig_cuda`,
  :mod:`.buildconfig_cudnn_nccl`, :mod:`.buildconfig_blas`, :mod:`.buildconfig_compiler`,
  :mod:`.buildconfig_torchvision`; :mod:`.comparison`: :class:`~.comparison.Comparison`, one comparison's result.
* :mod:`.facts`: what an installed torch says about itself (standard library only: also run as a script).
* :mod:`.provenance`: an installation against a build's manifest (versions, commits, sha256, files).
* :mod:`.proc`: bounded subprocess runs (a verify check must never hang).
* :mod:`.report`: the per-area summary (``summary.json``, ``summary.md``) written atomically.
* :mod:`.linkage`: every NEEDED entry of an installed distribution's ELF files, resolved for the machines
  it is deployed to, never through this one's directories (:mod:`torchkiln.artifacts.abi`); :mod:`.smoke`: upstream's runtime smoke checks as verdicts.
* :mod:`.battery` (standard library + torch: also run as a script), :mod:`.parity`, :mod:`.refenv`:
  ``verify --compare-with``, numerical parity with upstream's wheel.

May import: :mod:`torchkiln.recipe.model`, :mod:`torchkiln.recipe.compat`, :mod:`torchkiln.recipe.archs`,
:mod:`torchkiln.recipe.spelling`, :mod:`torchkiln.artifacts` (the manifest), :mod:`torchkiln.process`,
:mod:`torchkiln.host` (the dynamic loader), :mod:`torchkiln.files`, :mod:`torchkiln.errors`. Never the plan, the build, the images or the commands: the
suite runs on a GPU host that has only the wheels, the manifest and the recipe (import-linter checks it).
"""
