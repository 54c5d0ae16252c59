"""Writing and hashing files: what every layer that leaves something on disk uses.

:mod:`.atomic` writes a file under a temporary name and renames it (never a half-written wheel, manifest or
report, also on Ctrl-C), and removes the partials a killed writer left; :mod:`.digests` gives the sha256 of
a file, a tree or a JSON-able value (store keys, fingerprints, wheel records); :mod:`.shared` makes a tree's
large files hard links to one copy per content (the environment store's entries).

May import: :mod:`torchkiln.errors`, :mod:`torchkiln.process` (a partial's writer is alive or not).
"""
