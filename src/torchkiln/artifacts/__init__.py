"""What a build leaves for others: wheels in ``dist/``, the manifest, the lock file.

* :mod:`.dist`: ``dist/`` itself: wheels copied in atomically, superseded ones removed, and
  :func:`.published.read_published` (the manifest must list exactly the wheels there);
* :mod:`.manifest`: ``dist/manifest.json``, a typed document (:class:`.manifest.Manifest`);
* :mod:`.lockfile`: ``dist/<recipe>.lock.json``, the commit of each repository and submodule;
* :mod:`.jsonfile`: typed JSON documents: dataclasses written and read back with every field's type checked;
* :mod:`.wheelfile`: wheel file names and RECORD digests;
* :mod:`.bundle`: torchvision's codec libraries copied into its wheel (``python -m torchkiln.artifacts.bundle``);
* :mod:`.portability`, :mod:`.abi`, :mod:`.elf`, :mod:`.installed`: where a wheel runs (its record in the
  manifest), read from the wheel installed: each NEEDED entry resolved without the analysing machine's
  directories, the manylinux policy from auditwheel's data (docs/portability.md).

May import: :mod:`torchkiln.recipe.model` (what the manifest records), :mod:`torchkiln.host`,
:mod:`torchkiln.files`, :mod:`torchkiln.process`, :mod:`torchkiln.errors`. Never the build, the plan or the
commands: the verification suite and the images read these documents without them.
"""
