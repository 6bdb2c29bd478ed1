"""labutils: launch ranks from a notebook and measure GPU communication honestly.

Public API::

    labutils.launch(fn, *args, world_size=None, backend=None, timeout=120)  # -> list, rank order
    labutils.RankPool(world_size=None, backend=None, timeout=...)          # persistent ranks
    labutils.RankError, labutils.RankTimeout, labutils.LaunchConfigError
    labutils.timing, labutils.bandwidth, labutils.hw, labutils.plots, labutils.recorded
    labutils.debugging (reading NCCL_DEBUG logs, flight records), labutils.compat (torch name changes)
    python -m labutils hw | run-labs | bench

In IPython, ``%load_ext labutils`` adds the ``%ranks`` / ``%%ranks`` magics.

Layout: the core is the modules at this level; ``instruments/`` the measuring tools every lab shares
(communication ledger, profiler reader, memory probe, result comparison); ``pool/`` holds ``RankPool``,
``bench/`` the nccl-tests-style benchmark, ``commands/`` the CLI verbs, ``labs/labNN_topic/`` each lab's helpers,
``checks/`` and ``solutions/`` the exercises' checkers and reference solutions.
"""
from .errors import LaunchConfigError, RankError, RankTimeout
from .launch import default_config, launch

__version__ = "0.1.0"
__all__ = ["launch", "default_config", "RankPool", "RankError", "RankTimeout", "LaunchConfigError"]


def __getattr__(name):  # lazy: the pool pulls in more machinery than a plain launch needs
    if name == "RankPool":
        from .pool import RankPool
        return RankPool
    raise AttributeError(f"module 'labutils' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext labutils``: register the rank-pool magics."""
    from .pool.magics import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .pool.magics import unload_ipython_extension as _unload
    _unload(ipython)
