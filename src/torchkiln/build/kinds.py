"""What the builder does around each kind of step: :data:`KINDS` maps ``Step.kind`` to its kind.

The plan (:mod:`torchkiln.plan.make`) says what runs and declares what each step leaves behind and reads; a
:class:`~torchkiln.build.stepkind.StepKind` turns that into behaviour. The builder
(:mod:`torchkiln.build.loop`) is a loop that asks the step's kind, never the step's name. The kinds live by
family: :mod:`~torchkiln.build.stepkind` (the base, what every step's declared data asks for, and ``env``),
:mod:`~torchkiln.build.fetchkind`, :mod:`~torchkiln.build.compilekind` and :mod:`~torchkiln.build.wheelkinds`
(``package``, ``checks``, ``publish``); :mod:`~torchkiln.build.observers` reads a step's output as it
arrives. A new kind is a subclass and a row in :data:`KINDS` (and the kind's name in
:data:`torchkiln.plan.model.Kind`); what a kind may use is :class:`~torchkiln.build.context.Context`.
"""

from __future__ import annotations

from .compilekind import CompileKind
from .fetchkind import FetchKind
from .stepkind import EnvKind, StepKind
from .wheelkinds import ChecksKind, PackageKind, PublishKind

KINDS: dict[str, StepKind] = {
    kind.name: kind
    for kind in (FetchKind(), EnvKind(), CompileKind(), PackageKind(), ChecksKind(), PublishKind())
}
