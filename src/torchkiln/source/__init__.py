"""Source trees: the git commands that fetch a pinned ref, and what a checkout is at.

:mod:`.git` plans the fetch (argv lists: recipe strings are always one argument), checks a ``commit`` pin,
reads the resolved commit of a checkout and of each submodule into the lock file's entries, or a tree's
content hash when it is no git checkout.

May import: :mod:`torchkiln.recipe.model`, :mod:`torchkiln.artifacts` (the lock file's entries),
:mod:`torchkiln.files`, :mod:`torchkiln.process`, :mod:`torchkiln.errors`.
"""
