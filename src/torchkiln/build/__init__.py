"""The build: a loop over the plan's steps, each with what its kind does around it, then publish.

* :mod:`.loop`: :func:`.loop.run_build`, the step loop (skip what is unchanged, reuse venvs, run, record);
* :mod:`.kinds`: one :class:`.stepkind.StepKind` per kind of step (:data:`.kinds.KINDS`), which starts a
  :class:`.stepkind.StepRun` for each step of each build: fingerprint inputs, outputs intact, what to
  prepare, environment layers, what to record and check afterwards; the base in :mod:`.stepkind` (with
  ``env``), the others in :mod:`.fetchkind`, :mod:`.compilekind` and :mod:`.wheelkinds`, what reads a step's
  output in :mod:`.observers`;
* :mod:`.context`: :class:`.context.BuildSetup` (what is fixed for a build, frozen) and
  :class:`.context.BuildRecord` (what its steps found, append-only, read by publish);
  :mod:`.cachesession`: the build's compiler cache session;
* :mod:`.venvreuse`: :class:`.venvreuse.VenvReuse`, the environment store around each step of a build;
* :mod:`.fingerprint`: the records of ``state.json`` that make an unchanged step a no-op;
* :mod:`.envstore`: venvs kept by their content and cloned into other work directories;
* :mod:`.workdir`: what a build owns on disk before its first step (its lock, its layout);
* :mod:`.watch`: CMake's configure output read while it runs, stopping a build that came out wrong;
* :mod:`.vision_watch`: torchvision's setup.py lines read while it runs, stopping a build that drops a part;
* :mod:`.reconfigure`: a compile step's CMake cache dropped when its configuration changed;
* :mod:`.memory`: a compile step whose compiles the kernel killed for memory resumes with fewer jobs;
* :mod:`.buildreqs`: both projects' build requirements resolved together (``python -m torchkiln.build.buildreqs``);
* :mod:`.postcheck`: the post-build check, run as a script in a clean venv (:mod:`.checkvenv` makes that
  venv, :mod:`.venvprune` prunes it, :mod:`.warmcheck` clones it while the compile runs);
* :mod:`.portable`: its portability part (each installed wheel's record; the refusal of a wheel that needs
  what its targets lack), and the record of a build whose check was skipped;
* :mod:`.publish`: the last step: wheels, lock file and manifest into ``dist/``;
* :mod:`.progress`, :mod:`.display`: what the user sees.

May import: :mod:`torchkiln.plan` and everything below it, :mod:`torchkiln.verify` (the post-build check
uses the suite's own comparison). Never the images or the commands.
"""
