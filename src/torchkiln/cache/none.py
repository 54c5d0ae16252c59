"""Cache kind ``none``: no launcher, and nothing that would put one in front of the compiler anyway.

``torch.utils.cpp_extension`` (torchvision, extensions) puts the first of ``ccache``/``sccache`` found on
PATH in front of the compiler by itself (``_wrap_compiler``) unless ``TORCH_NO_COMPILER_WRAPPER`` is set,
and PyTorch's CMake build enables ccache when it finds it unless ``USE_CCACHE=0``.
"""

from __future__ import annotations

from .config import CacheConfig
from .tool import CacheTool


class NoCache(CacheTool):
    kind = "none"

    def public_env(self, config: CacheConfig) -> dict[str, str]:
        return {"USE_CCACHE": "0", "CCACHE_DISABLE": "1", "TORCH_NO_COMPILER_WRAPPER": "1"}
