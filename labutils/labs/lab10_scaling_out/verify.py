"""Lab 10's correctness harness: the hierarchical all-reduce and the 2-D mesh step against one device,
with what the communication ledger saw on each group. Rank functions (``pool.run(fn, ...)``); the
layers, the step and the all-reduce under test come from the notebook.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...instruments.ledger import Ledger


def two_tier_groups(local: int):
    """``(node_group, cross_group)`` of this rank for ``world_size / local`` "nodes" of ``local`` ranks each:
    ranks ``k*local .. k*local+local-1`` form node k; the ranks with the same position in their node form a
    cross group. Every rank creates every group (``new_group`` is collective).

    Raises:
        ValueError: ``local`` does not divide the world.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if local < 1 or n % local:
        raise ValueError(f"{n} ranks do not split into nodes of {local}. HINT: a divisor of {n}.")
    mine = {}
    for k in range(n // local):
        g = dist.new_group(list(range(k * local, (k + 1) * local)))
        if rank // local == k:
            mine["node"] = g
    for j in range(local):
        g = dist.new_group(list(range(j, n, local)))
        if rank % local == j:
            mine["cross"] = g
    return mine["node"], mine["cross"]


def tier_bytes(records, node_ranks: tuple, cross_ranks: tuple) -> dict:
    """Bytes this rank sent per tier, from ledger records: calls on the node's group are "intra", on the
    cross group "inter", anything else (the world, another group) "other"."""
    out = {"intra": 0.0, "inter": 0.0, "other": 0.0}
    for r in records:
        tier = "intra" if tuple(r.ranks) == node_ranks else "inter" if tuple(r.ranks) == cross_ranks else "other"
        out[tier] += r.wire_bytes
    return out


def hierarchical(rank: int, world_size: int, fn, local: int, numel: int) -> dict:
    """Run ``fn(tensor, node_group, cross_group)`` on a rank-dependent float64 tensor; the result against
    ``dist.all_reduce``'s, and the ledger's bytes per tier."""
    node, cross = two_tier_groups(local)
    x = torch.arange(numel, dtype=torch.float64) * (rank + 1) + rank
    want = x.clone()
    dist.all_reduce(want)
    with Ledger() as book:
        fn(x, node, cross)
    tiers = tier_bytes(book.records, tuple(dist.get_process_group_ranks(node)),
                       tuple(dist.get_process_group_ranks(cross)))
    return {"equal": bool(torch.equal(x, want)), "untouched": bool(torch.equal(
        x, torch.arange(numel, dtype=torch.float64) * (rank + 1) + rank)), **tiers,
        "ops": sorted({r.op for r in book.records})}


# ---------------------------------------------------------------------------------------- the mesh
def mesh_problem(hidden: int, ffn: int, tokens: int, seed: int = 0):
    """The one-device MLP (float64) and a batch of ``tokens`` inputs and targets, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    mlp = torch.nn.Sequential(torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden)).double()
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    y = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    return mlp, x, y


def one_device_training(mlp, x, y, steps: int, lr: float):
    """The reference: plain SGD on the whole batch, mean-squared error."""
    opt = torch.optim.SGD(mlp.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(mlp(x), y).backward()
        opt.step()
    return mlp


def group_names(records, mesh) -> list[dict]:
    """Each (op, group) the ledger saw, with the mesh dimension it ran on ("dp", "tp", or the ranks)."""
    dims = {tuple(dist.get_process_group_ranks(mesh[d].get_group())): d for d in mesh.mesh_dim_names}
    rows: dict = {}
    for r in records:
        key = (r.phase, r.op, dims.get(tuple(r.ranks), f"ranks {list(r.ranks)}"))
        row = rows.setdefault(key, {"phase": key[0], "op": key[1], "group": key[2], "calls": 0, "wire_bytes": 0.0})
        row["calls"] += 1
        row["wire_bytes"] += r.wire_bytes
    return list(rows.values())


def mesh_training(rank: int, world_size: int, TensorParallelMLP, sync, *, dp: int = 2, hidden: int = 8,
                  ffn: int = 16, tokens: int = 8, steps: int = 2, lr: float = 0.1) -> dict:
    """Train lab 02's tensor-parallel MLP on a ("dp", "tp") mesh -- TP inside "tp", each dp slice of the
    batch, gradients averaged by ``sync(model, mesh)`` -- and compare every shard of the weights with
    one-device training on the whole batch (``torch.testing.assert_close``); the ledger's calls per group."""
    from torch.distributed.device_mesh import init_device_mesh
    from ...config import rank_device
    if world_size % dp:
        raise ValueError(f"dp = {dp} does not divide {world_size} ranks. HINT: a divisor of {world_size}.")
    device = rank_device()
    mesh = init_device_mesh(device.type, (dp, world_size // dp), mesh_dim_names=("dp", "tp"))
    mlp, x, y = (t.to(device) for t in mesh_problem(hidden, ffn, tokens))
    reference = one_device_training(mesh_problem(hidden, ffn, tokens)[0].to(device), x, y, steps, lr)
    model = TensorParallelMLP(mlp, mesh["tp"].get_group())
    d = mesh.get_local_rank("dp")
    xs, ys = x.chunk(dp)[d], y.chunk(dp)[d]                   # this data-parallel slice of the batch
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    books = []
    for _ in range(steps):
        opt.zero_grad()
        with Ledger("forward + backward") as fb:
            torch.nn.functional.mse_loss(model(xs), ys).backward()
        with Ledger("gradient sync") as gs:
            sync(model, mesh)
        opt.step()
        books += fb.records + gs.records
    t, tp = mesh.get_local_rank("tp"), mesh["tp"].size()
    want = {"up.weight": reference[0].weight.chunk(tp, 0)[t], "up.bias": reference[0].bias.chunk(tp, 0)[t],
            "down.weight": reference[2].weight.chunk(tp, 1)[t], "down.bias": reference[2].bias}
    result = {}
    for name, p in model.named_parameters():
        try:
            torch.testing.assert_close(p.detach(), want[name])
            result[name] = True
        except AssertionError:
            result[name] = False
    steps_records = list(books)
    shard_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"equal": result, "groups": group_names(steps_records[: len(steps_records) // steps], mesh),
            "coordinate": {"dp": d, "tp": t}, "dp": dp, "shard_bytes": shard_bytes}
