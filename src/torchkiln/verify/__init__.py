"""Pure-Python support for the verification suite in ``verify/``.

The suite runs inside slim runtime images that hold torch, pytest and torchkiln's pure-Python core, so
nothing here imports the build machinery (git, compilers, caches, images), rich, or torch at module load:
functions that need torch import it when called.

* :mod:`.buildconfig`: parse ``torch.__config__.show()``, collect build facts, compare them with a recipe.
* :mod:`.archs`: which compiled CUDA architectures run on which device capability.
* :mod:`.proc`: bounded subprocess runs (a verify check must never hang).
* :mod:`.report`: the per-area summary (``summary.json``, ``summary.md``) written atomically.
"""
