"""The plan: everything a build will do, resolved from a recipe and this host, without running anything.

* :mod:`.model`: :class:`.model.Plan`, :class:`.model.Step` (each with a kind), sources and paths;
* :mod:`.make`: :func:`.make.make_plan`, the recipe turned into steps, phase by phase;
* :mod:`.environment`: :data:`.environment.ENV_TABLE`, every variable the build sets and why;
* :mod:`.jobs`: ``MAX_JOBS`` from cores, memory and cgroup limits;
* :mod:`.preflight`: whether this host can run a plan (``torchkiln check``), every problem at once;
* :mod:`.given_torch`: ``--torch``, the torch a torchvision-only build is built against.

May import: :mod:`torchkiln.recipe`, :mod:`torchkiln.source`, :mod:`torchkiln.artifacts`,
:mod:`torchkiln.cache`, :mod:`torchkiln.distributed`, :mod:`torchkiln.host` and below. Never the build
that runs a plan, the images or the commands.
"""
