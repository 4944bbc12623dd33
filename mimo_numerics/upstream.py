"""``mimo_numerics.upstream``: stage 1's upstream runner, re-exported for users from
:mod:`mimo_numerics.ops.mamba_mimo_bwd_fwd.upstream`.

The module lives in stage 1's operator folder; code inside the package, the scripts and the tests import it from
there (``tests/test_layout.py`` refuses an internal import of this alias).
"""

from .ops.mamba_mimo_bwd_fwd.upstream import (  # noqa: F401
    UPSTREAM_VERSION, KERNEL_SHA256, UTILS_SHA256, KERNEL_RELPATH, UTILS_RELPATH, KERNEL_MODULE, UTILS_MODULE,
    ENV_VAR, THREADS, NUM_STAGES, PathLike, UpstreamError, UpstreamUnavailable, UpstreamUnsupported,
    find_source, source_info, load_upstream, load_upstream_files, unload_upstream, refusal_reason,
    check_supported, check_cuda, availability, mamba_mimo_bwd_fwd, last_launch, sha256,
)

__all__ = ["UPSTREAM_VERSION", "KERNEL_SHA256", "UTILS_SHA256", "KERNEL_RELPATH", "UTILS_RELPATH",
           "KERNEL_MODULE", "UTILS_MODULE", "ENV_VAR", "THREADS", "NUM_STAGES", "PathLike",
           "UpstreamError", "UpstreamUnavailable", "UpstreamUnsupported", "find_source",
           "source_info", "load_upstream", "load_upstream_files", "unload_upstream",
           "refusal_reason", "check_supported", "check_cuda", "availability", "mamba_mimo_bwd_fwd",
           "last_launch", "sha256"]
