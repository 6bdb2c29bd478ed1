"""How NCCL spreads one send/recv over channels and warps (NCCL 2.23-2.30), for lab 06's duplex section.

NCCL runs the send/recv of one group as one kernel, one block (CTA) per channel it uses:

* **channels** (``src/enqueue.cc``: ``scheduleP2pTasksToPlan``, ``addP2pToPlan``): a p2p operation
  starts from ``nChannelsMin`` channels -- the peer's channels halved until ``nChannelsMin x nRanks``
  fits in the communicator's p2p channels -- and doubles them, up to the peer's channels, while
  each channel's part of the message is larger than ``32 x`` the P2P chunk (single node;
  ``NCCL_P2P_NVL_CHUNKSIZE``, 512 KiB on NVLink). Small messages use fewer: one per
  ``chunk / 8`` bytes.
* **warps** (``src/device/sendrecv.h``: ``RunWorkBatch<ncclFuncSendRecv>::run``): a block has 640
  threads (``NCCL_MAX_NTHREADS``), 20 warps. A block whose channel carries a send *and* a receive
  (an exchange with one peer) gives the send 10 warps and the receive 9; a block with only one of
  them gives it 19.

The parameters are the ones NCCL prints at start-up with ``NCCL_DEBUG=INFO`` (lab 05 records that
log)::

    params = p2p_channels.from_nccl_log(log)     # {"p2p_channels": 32, "per_peer": 32, "chunk_bytes": ...}
    p2p_channels.channels(512 * 2**20, **params)  # 32
    p2p_channels.sending_warps(16, both_ways=True)   # 160
"""
from __future__ import annotations

import re

BLOCK_WARPS = 20                   # NCCL_MAX_NTHREADS / 32
SEND_WARPS = {True: 10, False: 19}  # a block's warps that send: exchange (send + recv) vs one way
PART_CHUNKS = 32                   # single node: a channel's part may hold up to 32 chunks

_P2P = re.compile(r"(\d+) p2p channels, (\d+) p2p channels per peer")
_CHUNK = re.compile(r"P2P Chunksize set to (\d+)")
_RANKS = re.compile(r"nRanks (\d+) nNodes (\d+)")


def from_nccl_log(log: str) -> dict | None:
    """``{"p2p_channels", "per_peer", "chunk_bytes", "n_ranks", "n_nodes"}`` from an NCCL INFO log
    (the first communicator it describes), or None when the log lacks any of them (no
    ``NCCL_DEBUG=INFO``, or an NCCL that words them differently)."""
    p2p, chunk, ranks = _P2P.search(log), _CHUNK.search(log), _RANKS.search(log)
    if not (p2p and chunk and ranks):
        return None
    return {"p2p_channels": int(p2p.group(1)), "per_peer": int(p2p.group(2)), "chunk_bytes": int(chunk.group(1)),
            "n_ranks": int(ranks.group(1)), "n_nodes": int(ranks.group(2))}


def channels(size_bytes: int, *, p2p_channels: int, per_peer: int, chunk_bytes: int, n_ranks: int,
             n_nodes: int = 1) -> int:
    """Channels NCCL gives one send (or receive) of ``size_bytes`` to one peer, SIMPLE protocol.

    Raises:
        ValueError: a size below one byte or parameters that are not positive.
    """
    if size_bytes < 1 or min(p2p_channels, per_peer, chunk_bytes, n_ranks, n_nodes) < 1:
        raise ValueError(f"channels() needs positive values, got size {size_bytes}, p2p_channels {p2p_channels}, "
                         f"per_peer {per_peer}, chunk {chunk_bytes}, n_ranks {n_ranks}, n_nodes {n_nodes}. "
                         "HINT: read them with from_nccl_log() from an NCCL_DEBUG=INFO log.")
    n_min = per_peer
    while n_min * n_ranks > p2p_channels and n_min > 1:
        n_min //= 2
    min_part = chunk_bytes // 2 if n_nodes > 1 else chunk_bytes // 8
    max_part = chunk_bytes if n_nodes > 1 else chunk_bytes * PART_CHUNKS
    n = min(n_min, -(-size_bytes // max(min_part, 1)))
    part = max(min_part, -(-size_bytes // n))
    while part > max_part and n <= per_peer // 2:
        n *= 2
        part = -(-size_bytes // n)
    return n


def sending_warps(n_channels: int, both_ways: bool) -> int:
    """Warps that push one direction's data: per block 10 in an exchange, 19 in a one-way send."""
    return n_channels * SEND_WARPS[bool(both_ways)]
