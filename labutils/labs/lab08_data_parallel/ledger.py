"""The ZeRO paper's communication volume, read off the ledger of what a step issued (DDP's reducer,
a hand-written ZeRO step, FSDP2 -- whoever calls the collectives).

    from labutils.instruments.ledger import Ledger
    with Ledger() as book:
        loss.backward()                      # DDP all-reduces its buckets in here
    book.counts()                            # {"all_reduce": 4}
    volume_in_params(book, n_params)         # 2.0 for DDP: the ZeRO paper's "2 Psi"

Volume, as the ZeRO paper counts it (Rajbhandari et al., SC'20, section 7): an all-reduce of S bytes
is a reduce-scatter plus an all-gather, 2 S; a reduce-scatter counts its input S, an all-gather its
output S -- the ledger's ``size_bytes``. A ring puts (N - 1) / N of that on each rank's link (the
ledger's ``wire_bytes``).
"""
from __future__ import annotations

VOLUME_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}


def volume_bytes(book, ops=("all_reduce", "reduce_scatter", "all_gather")) -> int:
    """The ZeRO paper's communication volume of a ``Ledger``: 2 S per all-reduce, S per reduce-scatter
    / all-gather."""
    return sum(VOLUME_FACTOR[r.op] * r.size_bytes for r in book.records if r.op in ops)


def volume_in_params(book, n_params: int, bytes_per_element: int | None = None) -> float:
    """``volume_bytes`` in units of Psi elements (2.0 = "2 Psi"). ``bytes_per_element``: the
    gradients' element size (default: that of the first recorded call)."""
    if n_params <= 0:
        raise ValueError(f"n_params must be > 0, got {n_params}.")
    if not book.records:
        return 0.0
    size = bytes_per_element or book.records[0].element_size
    return volume_bytes(book) / (n_params * size)
