"""Recipes: what a recipe is, how one is read, and which recipes can work.

* :mod:`.model`: the typed, frozen recipe (:class:`.model.Recipe` and its sections);
* :mod:`.loader`: a TOML file checked field by field against :data:`.schema.SCHEMA` and built into the model,
  every problem reported in one pass (:func:`.loader.load_recipe`);
* :mod:`.schema`: every field a recipe may have, one row each (type, check, where the model keeps it);
  :mod:`.validators`: the checks of one field's value, and the grammar every string field obeys;
* :mod:`.rules`: the compatibility rules (:data:`.rules.RULES`) over the data of :mod:`.compat`, their checks
  by subject in :mod:`.rules_versions`, :mod:`.rules_cuda`, :mod:`.rules_toolchain` and :mod:`.rules_settings`
  (:mod:`.rules_findings`: what a check yields);
* :mod:`.compat`: ``data/compat.toml``, the facts per torch release and CUDA version, each with its source;
* :mod:`.cmake_options`: the CMake options and environment knobs each torch release reads, host-tool minimums;
* :mod:`.archs`: CUDA arch list entries and what they compile to; :mod:`.spelling`: how build settings spell
  true and false;
* :mod:`.vision_setup`: ``data/vision_setup.toml``, what torchvision's setup.py prints when it drops a part.

May import: :mod:`torchkiln.cache` and :mod:`torchkiln.distributed` (a recipe's ``[cache]`` and ``[cluster]``
are resolved by the same code the build uses), :mod:`torchkiln.process`, :mod:`torchkiln.errors`.
The verification suite reads :mod:`.model`, :mod:`.compat`, :mod:`.archs` and :mod:`.spelling` only.
"""
