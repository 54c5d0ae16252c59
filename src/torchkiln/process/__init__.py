"""The processes torchkiln starts, and their environments, secrets and logs.

Every process a build, a check or an image build starts goes through :mod:`.runner`: argv lists only (never
a shell), a process group each, timeouts, secrets redacted from what is shown, the first real error picked
out of a log (:mod:`.logs`; compiles the kernel killed for memory: :mod:`.killed`), and a watchdog (:mod:`.supervisor`) that kills what a run started once
torchkiln is gone, SIGKILL included. :mod:`.environ` composes a step's environment in layers (the caller's
minus everything that steers PyTorch's build); :mod:`.secrets` reads secrets from files or variables and
redacts them.

Types to look at first: :class:`.runner.Redact`, :func:`.runner.run`, :func:`.environ.compose`.

May import: :mod:`torchkiln.errors` only. Nothing here knows recipes, plans or builds.
"""
