"""What the builder does around each kind of step: :data:`KINDS` maps ``Step.kind`` to its kind.

The plan (:mod:`torchkiln.plan.make`) says what runs and declares what each step leaves behind and reads; a
:class:`~torchkiln.build.stepkind.StepKind` says how the loop treats its steps and starts, for each step of
each build, a :class:`~torchkiln.build.stepkind.StepRun` that turns that into behaviour. The builder
(:mod:`torchkiln.build.loop`) is a loop that asks the step's kind, never the step's name. The kinds live by
family: :mod:`~torchkiln.build.stepkind` (the base run, what every step's declared data asks for, and
``env``), :mod:`~torchkiln.build.fetchkind`, :mod:`~torchkiln.build.compilekind` and
:mod:`~torchkiln.build.wheelkinds` (``package``, ``checks``, ``publish``); :mod:`~torchkiln.build.observers`
reads a step's output as it arrives. A new kind is a :class:`~torchkiln.build.stepkind.StepRun` subclass, its
:class:`~torchkiln.build.stepkind.StepKind` row here (and the kind's name in :data:`torchkiln.plan.model.Kind`).
The table is read-only and its kinds are frozen: what a run learns is the run's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .compilekind import COMPILE
from .fetchkind import FETCH
from .stepkind import ENV, StepKind
from .wheelkinds import CHECKS, PACKAGE, PUBLISH

KINDS: Mapping[str, StepKind] = MappingProxyType(
    {kind.name: kind for kind in (FETCH, ENV, COMPILE, PACKAGE, CHECKS, PUBLISH)}
)
