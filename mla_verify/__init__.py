"""mla_verify: autotuned Triton attention for the speculative-decoding verify
step of absorbed-MLA models (DeepSeek-V3/R1, Kimi-K2).

    from mla_verify import verify_mla_fwd     # SGLang's extend-attention convention
    from mla_verify import verify_mla_paged   # FlashMLA's paged-cache convention
    from mla_verify import paged_metadata     # a step's part of every layer's paged call

Importing the package loads the tuned tables once and registers the
torch.library ops (``mla_verify.ops``); launches only look up.
"""

__version__ = "0.1.0"

from . import ops  # noqa: E402, F401  (registers the custom ops)
from .api import can_handle, set_debug, verify_mla_fwd  # noqa: E402
from .config import VerifyConfig, default_config  # noqa: E402
from .device import current_arch  # noqa: E402
from .lookup import block_config, resolve_config  # noqa: E402
from .paged import PagedMetadata, paged_metadata, verify_mla_paged  # noqa: E402
from .reference import verify_mla_reference  # noqa: E402
from .workspace import prepare_paged_workspace, prepare_workspace, workspace_bytes  # noqa: E402

__all__ = [
    "PagedMetadata",
    "VerifyConfig",
    "block_config",
    "can_handle",
    "current_arch",
    "default_config",
    "paged_metadata",
    "prepare_paged_workspace",
    "prepare_workspace",
    "resolve_config",
    "set_debug",
    "verify_mla_fwd",
    "verify_mla_paged",
    "verify_mla_reference",
    "workspace_bytes",
]
