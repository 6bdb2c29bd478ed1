"""Lab 03's exchange: the source's isend/irecv example as written, and the harness that checks the fixes.

The three fixed exchanges themselves are code in the notebook (section 1); here is what runs and judges them.
Every rank function has the ``fn(rank, world_size, ...)`` form of ``labutils.launch`` / ``RankPool.run`` and
runs on gloo (CPU tensors) and NCCL (one GPU per rank)::

    import labutils
    from labutils.labs.lab03_async_p2p import exchange
    summaries = labutils.launch(exchange.source_as_written, backend="gloo", world_size=2)
    exchange.source_blocks(summaries)                          # which chunk each block of final_result is
    per_rank = pool.run(exchange.verify_fixes, {"mine": my_gather})
    exchange.fixes_table(per_rank)                             # equal to tensor * 2 on every rank?

* ``source_as_written``: the second source's rank function (002, section 5.2), verbatim except that it
  returns checksums instead of printing; ``diagnose_source`` and ``source_blocks`` read them.
* ``source_input``: the source's data made consistent (one seeded tensor for every rank).
* ``verify_fixes`` / ``fixes_table``: a gather function against the one-device reference ``tensor * 2``.
* ``attempt``: run a rank function and report what happened (JSON, recordable) instead of raising.

The same exchange on CUDA tensors runs outside labutils, as a standalone script (``repro``); the rings of
the lab's exercises are in ``labutils.solutions.lab03``, timed against NCCL by ``measure``.
"""
from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist

from ...config import rank_device
from ...errors import RankError, RankTimeout

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
    """Findings about the source's output, from every rank's ``source_as_written`` summary: the shape of
    ``final_result`` against the gathered tensor's, and whether the ranks drew the same random tensor
    (which block is which: ``source_blocks``)."""
    shapes = sorted({tuple(s["shape"]) for s in summaries})
    same = len({s["tensor_sum"] for s in summaries}) == 1
    return [f"final_result shape: {' / '.join(str(s) for s in shapes)} on every rank "
            f"(the gathered tensor is {(SOURCE_ROWS, SOURCE_COLS)})",
            f"all ranks drew the same torch.randn(1000, 1000): {same}"]


def source_blocks(summaries: list[dict]):
    """``final_result``'s blocks per rank as a DataFrame: "chunk k" where a block equals rank k's ``result``,
    "never written" where it equals nobody's (``torch.empty_like`` memory no receive wrote)."""
    import pandas as pd
    owner = {s["result_sum"]: r for r, s in enumerate(summaries) if s["result_sum"] is not None}
    names = ["result"] + [f"received_results[{i}]" for i in range(len(summaries))]
    rows = {f"rank {r}": {name: "never written" if owner.get(b) is None else f"chunk {owner[b]}"
                          for name, b in zip(names, s["block_sums"])} for r, s in enumerate(summaries)}
    return pd.DataFrame.from_dict(rows, orient="index")


# ------------------------------------------------------------------------------------------------
# The fixes, judged
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


def verify_fixes(rank: int, world_size: int, fixes: dict) -> dict:
    """Run every ``fixes[name](result, rows)`` on the source's (seeded) data on this rank's device and
    compare it bit for bit with the one-device reference ``tensor * 2``.

    Returns:
        ``{name: {"shape": [rows, cols], "equal": bool}}`` for this rank.
    """
    tensor, result, rows = source_input(rank, world_size, rank_device())
    expected = tensor * 2
    out = {}
    for name, fn in fixes.items():
        got = fn(result, rows).cpu()
        out[name] = {"shape": list(got.shape), "equal": torch.equal(got, expected)}
    return out


def fixes_table(per_rank: list[dict]):
    """One row per fix: the gathered shape(s) and whether *every* rank holds exactly ``tensor * 2``."""
    import pandas as pd
    rows = {name: {"shape": " / ".join(str(s) for s in sorted({tuple(r[name]["shape"]) for r in per_rank})),
                   "equals tensor * 2 on every rank": all(r[name]["equal"] for r in per_rank)}
            for name in per_rank[0]}
    return pd.DataFrame.from_dict(rows, orient="index")


def attempt(run, fn, *args, **kwargs) -> dict:
    """``run(fn, *args, **kwargs)`` (``labutils.launch`` or a pool's ``run``) that reports instead of raising.

    Returns:
        ``{"status": "completed" | "RankTimeout" | "RankError", "elapsed_s", "message", "value"}``, plus
        ``"rank", "exc_type", "exit_code", "tail"`` (last lines of the failed rank's traceback or output) for
        a RankError. JSON types only (recordable).
    """
    t0, info = time.monotonic(), {"status": "completed", "message": "", "value": None}
    try:
        info["value"] = json.loads(json.dumps(run(fn, *args, **kwargs), default=lambda x: None))
    except RankTimeout as exc:
        info.update(status="RankTimeout", message=str(exc))
    except RankError as exc:
        info.update(status="RankError", message=str(exc), rank=exc.rank, exc_type=exc.exc_type,
                    exit_code=exc.exit_code, tail=exc.traceback.strip().splitlines()[-6:])
    info["elapsed_s"] = round(time.monotonic() - t0, 1)
    return info
