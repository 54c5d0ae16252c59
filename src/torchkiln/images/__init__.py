"""Container images: a recipe's devel, wheels and runtime images, and ``docker-bake.json``.

* :mod:`.spec`: what each image is: base images, build args and labels from a recipe
  (:func:`.spec.devel_args`, :func:`.spec.runtime_args`);
* :mod:`.engines`: one :class:`.engines.Engine` per container engine (docker, podman, buildah): how its CLI
  spells a build, a run and an inspection;
* :mod:`.bake`: ``docker-bake.json`` generated from the shipped recipes.

May import: :mod:`torchkiln.recipe`, :mod:`torchkiln.artifacts`, :mod:`torchkiln.process` and below. Never
the build, the plan or the commands.
"""
