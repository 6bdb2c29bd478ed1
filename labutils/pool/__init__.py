"""Persistent ranks for notebook-driven experiments: ``RankPool`` and the ``%%ranks`` magic.

* ``pool.py``: ``RankPool`` -- ranks started once, ``run(fn)`` with the contract of
  ``labutils.launch``, ``exec(code)`` in per-rank namespaces kept between calls;
* ``status.py``: ``PoolStatus``, what ``RankPool.status()`` reports;
* ``task.py``: one task's wait loop and fault rules (keep the pool, or restart it);
* ``ranks.py``: one generation of rank processes, their connections and output pipes;
* ``protocol.py``: the authenticated loopback control channel, messages, output framing;
* ``worker.py``: the rank end (``python -m labutils.pool.worker``);
* ``magics.py``: ``%load_ext labutils`` -> ``%ranks start|stop|restart|status|fetch|push|use``
  and the ``%%ranks`` cell magic.
"""
from .pool import RankPool
from .status import PoolStatus
from .task import RanksInterrupted

__all__ = ["RankPool", "PoolStatus", "RanksInterrupted"]
