"""What a build leaves for others: wheels in ``dist/``, the manifest, the lock file.

* :mod:`.dist`: ``dist/`` itself: wheels copied in atomically, superseded ones removed, and
  :func:`.dist.read_published` (the manifest must list exactly the wheels there);
* :mod:`.manifest`: ``dist/manifest.json``, a typed document (:class:`.manifest.Manifest`);
* :mod:`.lockfile`: ``dist/<recipe>.lock.json``, the commit of each repository and submodule;
* :mod:`.jsonfile`: typed JSON documents: dataclasses written and read back with every field's type checked;
* :mod:`.wheelfile`: wheel file names and RECORD digests;
* :mod:`.bundle`: torchvision's codec libraries copied into its wheel (``python -m torchkiln.artifacts.bundle``).

May import: :mod:`torchkiln.recipe.model` (what the manifest records), :mod:`torchkiln.host`,
:mod:`torchkiln.files`, :mod:`torchkiln.process`, :mod:`torchkiln.errors`. Never the build, the plan or the
commands: the verification suite and the images read these documents without them.
"""
