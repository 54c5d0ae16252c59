"""The command line: one module per ``torchkiln`` subcommand, each a ``register`` (its arguments) and a
``run`` (turn them into calls of the layers below, and an exit status).

``torchkiln.cli`` builds the parser from these modules; a command holds no logic of its own beyond reading
its arguments: ``plan`` and ``check`` and ``build`` share one argument set (:mod:`.plan`), so what is
planned, checked and built is the same.

May import every package. Nothing below imports a command.
"""
