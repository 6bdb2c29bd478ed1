"""Lab 03's exchange: the source's isend/irecv example as written, and three correct versions.

Every rank function here has the ``fn(rank, world_size, ...)`` form of ``labutils.launch`` and runs
on gloo (CPU tensors) and NCCL (one GPU per rank)::

    import labutils
    from labutils.labs.lab03_async_p2p import exchange
    exchange.report_fixes(labutils.launch(exchange.fixed_versions, backend="gloo"))  # three correct gathers

* ``source_as_written``: the second source's rank function (002, section 5.2), verbatim except that
  it returns checksums instead of printing; ``diagnose_source`` reads them.
* ``gather_ordered`` / ``gather_batched`` / ``gather_collective``: three correct exchanges,
  verified by ``fixed_versions`` against the one-device reference ``tensor * 2``.

The same exchange on CUDA tensors under NCCL, and its hang, are in ``hang``; the rings of the
lab's exercises in ``labutils.solutions.lab03``, timed against NCCL by ``measure``.
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from ...compat import all_gather_into_tensor
from ...config import rank_device

SOURCE_ROWS = SOURCE_COLS = 1000  # torch.randn(1000, 1000) in the source
SEED = 0


def chunk_rows(n_rows: int, world_size: int) -> list[int]:
    """Rows of each piece of ``torch.chunk(x, world_size)`` for ``x`` with ``n_rows`` rows.

    torch.chunk makes pieces of ``ceil(n_rows / world_size)`` rows, the last one smaller -- so the
    pieces differ in size unless ``world_size`` divides ``n_rows`` (1000 rows on 3 ranks: 334, 334,
    332), and for some sizes there are fewer pieces than ranks.

    Raises:
        ValueError: torch.chunk would return fewer than ``world_size`` pieces.
    """
    size = -(-n_rows // world_size)
    rows = [min(size, n_rows - i * size) for i in range(world_size)]
    if any(r <= 0 for r in rows):
        raise ValueError(f"torch.chunk splits {n_rows} rows into fewer than {world_size} pieces "
                         f"({[r for r in rows if r > 0]}), so some rank gets none. HINT: use "
                         "torch.tensor_split, which always returns world_size pieces.")
    return rows


# ------------------------------------------------------------------------------------------------
# The source program, as written
# ------------------------------------------------------------------------------------------------

def _checksum(t: torch.Tensor) -> float | None:
    s = float(t.double().sum())
    return s if s == s and abs(s) != float("inf") else None  # garbage memory may hold NaN/inf


def source_as_written(rank: int, world_size: int) -> dict:
    """The source's ``async_communication`` body, unchanged; ``print(final_result)`` becomes a summary.

    Returns:
        ``{"shape", "tensor_sum", "result_sum", "block_sums"}``: the final shape and float64
        checksums of this rank's random tensor, of its own result and of each block that
        ``torch.cat`` glued together (for ``diagnose_source``).
    """
    # ---- from here to final_result: the source's code ----
    tensor = torch.randn(1000, 1000)
    split_tensor = torch.chunk(tensor, world_size, dim=0)
    local_tensor = split_tensor[rank]
    result = local_tensor * 2
    reqs = []
    for i in range(world_size):
        if i != rank:
            req = dist.isend(result, dst=i)
            reqs.append(req)
    received_results = [torch.empty_like(result) for _ in range(world_size)]
    for i in range(world_size):
        if i != rank:
            req = dist.irecv(received_results[i], src=i)
            reqs.append(req)
    for req in reqs:
        req.wait()
    final_result = torch.cat([result] + received_results, dim=0)
    # ---- instead of print(final_result) ----
    return {"shape": list(final_result.shape), "tensor_sum": _checksum(tensor),
            "result_sum": _checksum(result),
            "block_sums": [_checksum(b) for b in [result] + received_results]}


def diagnose_source(summaries: list[dict]) -> list[str]:
    """Findings about the source's output, from every rank's ``source_as_written`` summary.

    A block is identified by its checksum: it equals some rank's ``result`` (then it is that
    rank's chunk) or nobody's (then ``torch.empty_like`` memory that no receive ever wrote).
    """
    n = len(summaries)
    owner = {s["result_sum"]: r for r, s in enumerate(summaries) if s["result_sum"] is not None}
    shapes = sorted({tuple(s["shape"]) for s in summaries})
    lines = [f"final_result shape: {' / '.join(str(s) for s in shapes)} on every rank "
             f"(the gathered tensor is {(SOURCE_ROWS, SOURCE_COLS)})"]
    for r, s in enumerate(summaries):
        names = ["result"] + [f"received_results[{i}]" for i in range(n)]
        parts = []
        for name, block in zip(names, s["block_sums"]):
            src = owner.get(block)
            parts.append(f"{name} = " + ("never written" if src is None else f"chunk {src}"))
        lines.append(f"rank {r} concatenates: " + ", ".join(parts))
    lines.append("correct order: " + ", ".join(f"chunk {k}" for k in range(n)))
    same = len({s["tensor_sum"] for s in summaries}) == 1
    lines.append(f"all ranks drew the same torch.randn(1000, 1000): {same}")
    return lines


# ------------------------------------------------------------------------------------------------
# Three correct versions
# ------------------------------------------------------------------------------------------------

def source_input(rank: int, world_size: int, device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The source's data, made consistent: every rank draws the *same* seeded tensor.

    Returns:
        ``(tensor, result, rows)``: the full CPU tensor, this rank's ``chunk * 2`` on ``device``,
        and the rows of every rank's chunk (``chunk_rows``).
    """
    tensor = torch.randn(SOURCE_ROWS, SOURCE_COLS, generator=torch.Generator().manual_seed(SEED))
    rows = chunk_rows(SOURCE_ROWS, world_size)
    return tensor, (torch.chunk(tensor, world_size, dim=0)[rank] * 2).to(device), rows


def _parts(result: torch.Tensor, rows: list[int]) -> list[torch.Tensor]:
    parts = [result.new_empty(r, *result.shape[1:]) for r in rows]
    parts[dist.get_rank()] = result  # our own slot is our result: nothing to receive
    return parts


def gather_ordered(result: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Blocking send/recv, deadlock-free by order: pairs (i, j), i < j, in one global order; in each
    pair the lower rank sends first and the higher rank receives first."""
    rank, parts = dist.get_rank(), _parts(result, rows)
    for i, j in itertools.combinations(range(dist.get_world_size()), 2):
        if rank == i:
            dist.send(result, dst=j)
            dist.recv(parts[j], src=j)
        elif rank == j:
            dist.recv(parts[i], src=i)
            dist.send(result, dst=i)
    return torch.cat(parts, dim=0)


def gather_batched(result: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """All sends and receives in one ``batch_isend_irecv`` (one ncclGroupStart/End under NCCL, so
    they progress together and their order in the list does not matter)."""
    rank, parts = dist.get_rank(), _parts(result, rows)
    ops = []
    for i in range(dist.get_world_size()):
        if i != rank:
            ops += [dist.P2POp(dist.isend, result, i), dist.P2POp(dist.irecv, parts[i], i)]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    return torch.cat(parts, dim=0)


def gather_collective(result: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The collective made for the job. ``all_gather_into_tensor`` needs equal pieces, so uneven
    chunks are padded to the largest and trimmed after."""
    n, m = dist.get_world_size(), max(rows)
    padded = result.new_zeros(m, *result.shape[1:])
    padded[: result.shape[0]] = result
    out = result.new_empty(n * m, *result.shape[1:])
    all_gather_into_tensor(out, padded)
    return torch.cat([out[k * m: k * m + rows[k]] for k in range(n)], dim=0)


FIXES = {"ordered send/recv": gather_ordered, "batch_isend_irecv (P2POp)": gather_batched,
         "all_gather_into_tensor": gather_collective}


def fixed_versions(rank: int, world_size: int) -> dict:
    """Run every fix on the source's (seeded) data; compare with the one-device ``tensor * 2``.

    Returns:
        ``{fix name: {"shape": [rows, cols], "equal": bool}}`` for this rank.
    """
    tensor, result, rows = source_input(rank, world_size, rank_device())
    expected = tensor * 2
    out = {}
    for name, fn in FIXES.items():
        got = fn(result, rows).cpu()
        out[name] = {"shape": list(got.shape), "equal": torch.equal(got, expected)}
    return out


def report_fixes(per_rank: list[dict]) -> list[str]:
    """One line per fix: the gathered shape and whether every rank holds exactly ``tensor * 2``."""
    lines = []
    for name in per_rank[0]:
        shapes = sorted({tuple(r[name]["shape"]) for r in per_rank})
        ok = all(r[name]["equal"] for r in per_rank)
        lines.append(f"{name:<27} shape {' / '.join(map(str, shapes))}, "
                     f"equals tensor * 2 on every rank: {ok}")
    return lines
