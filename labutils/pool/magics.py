"""IPython magics for a persistent rank pool (``%load_ext labutils``), in the spirit of ipyparallel's %%px.

    %ranks start [N] [--backend gloo|nccl] [--timeout S]  (re)start the pool (defaults as launch)
    %ranks status | stop | restart
    %ranks fetch NAME [NAME ...] [-r RANKS]  -> [value on each rank] (a dict of lists for several)
    %ranks push NAME [NAME ...] [-r RANKS]   copy notebook variables into every rank's namespace
    %ranks use POOL                           drive an existing labutils.RankPool object

    %%ranks [-r 0,1] [--timeout S] [--fetch NAME[,NAME]] [--output grouped|live|quiet]
    x = torch.ones(1, device=device) * (rank + 1)   # runs on every selected rank
    dist.all_reduce(x)                               # rank, world_size, device, torch, dist exist
    x.item()                                         # a last expression is printed per rank

Each rank keeps its own namespace between cells (until the pool is restarted); each rank's output
is printed under ``[rank r]``, grouped in rank order; ``--fetch x`` assigns ``x = [x on rank 0,
x on rank 1, ...]`` (selected ranks, rank order) in the notebook. Errors are those of
``RankPool.run``: RankError with the rank's traceback, RankTimeout, RanksInterrupted (a
KeyboardInterrupt). A rank's traceback names the cell as ``<%%ranks cell N>``, N the cell's
``In [N]`` number.

One error is no error: an exercise left as its stub. When every selected rank raised
``NotImplementedError`` and nothing else happened (no rank died, none was stuck), the cell prints
one "not attempted" line on stderr and returns, so a notebook whose ``%%ranks`` exercises are
untouched still runs to its end; its checker then says "not attempted" (no points).
"""
from __future__ import annotations

import sys

from IPython.core import magic_arguments as ma
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..errors import RankError
from .pool import OUTPUTS, RankPool

USAGE = __doc__.split("\n\n")[1]
NOT_ATTEMPTED = ("not attempted: this cell raises NotImplementedError on every rank (an exercise left "
                 "as its stub); the notebook goes on.")


@ma.magic_arguments("%ranks")
@ma.argument("command", nargs="?", default="status",
             choices=["start", "stop", "restart", "status", "fetch", "push", "use"])
@ma.argument("names", nargs="*")
@ma.argument("--backend", default=None)
@ma.argument("--timeout", type=float, default=None)
@ma.argument("-r", "--ranks", default=None)
def line_arguments():
    """``%ranks`` (the line magic): start, stop, restart, status, fetch, push or use a pool."""


@ma.magic_arguments("%%ranks")
@ma.argument("-r", "--ranks", default=None)
@ma.argument("--timeout", type=float, default=None)
@ma.argument("--fetch", default="")
@ma.argument("--output", default=None, choices=OUTPUTS)
def cell_arguments():
    """``%%ranks`` (the cell magic): run the cell on the selected ranks."""


def parse(arguments, line: str):
    """``line`` parsed with IPython's ``magic_arguments`` (``line_arguments`` or ``cell_arguments``);
    a mistake raises ``UsageError`` with the usage (in a notebook: an error, never SystemExit)."""
    try:
        return ma.parse_argstring(arguments, line)
    except UsageError as exc:
        raise UsageError(f"%ranks: {exc}\n{USAGE}") from None


def parse_ranks(spec: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]`` (``"all"`` -> None is handled by the caller)."""
    out: list[int] = []
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise UsageError(f"%ranks: cannot read ranks {spec!r}. HINT: e.g. -r 0 or -r 0,1 or -r 0-3.")
    return out


def not_attempted(exc: RankError, selected) -> bool:
    """True if ``exc`` says every rank in ``selected`` raised NotImplementedError, and nothing else
    (a stub): no rank died (no exception type), none was stuck or interrupted."""
    return set(exc.exc_types) == set(selected) and set(exc.exc_types.values()) == {"NotImplementedError"}


@magics_class
class RanksMagics(Magics):
    """``%ranks`` / ``%%ranks``; the pool belongs to this shell (closed on unload or kernel exit)."""

    def __init__(self, shell=None):
        super().__init__(shell)
        self.pool: RankPool | None = None

    def _selected(self, spec):
        return None if spec in (None, "all") else parse_ranks(spec)

    def _require_pool(self) -> RankPool:
        if self.pool is None or self.pool.closed:
            self.pool = RankPool()
            print(f"labutils: %%ranks started a pool of {self.pool.world_size} ranks "
                  "(%ranks stop ends it).")
        return self.pool

    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None):
        if cell is not None:
            return self._cell(line, cell)
        args = parse(line_arguments, line)
        cmd = args.command
        if cmd == "start":
            if len(args.names) > 1 or (args.names and not args.names[0].isdigit()):
                raise UsageError(f"%ranks start takes one number of ranks, got {args.names}.\n{USAGE}")
            world_size = int(args.names[0]) if args.names else None
            self.stop(quiet=True)
            kw = {} if args.timeout is None else {"timeout": args.timeout}
            self.pool = RankPool(world_size, args.backend, **kw)
            print(self.pool.status())
        elif cmd == "stop":
            self.stop()
        elif cmd == "restart":
            self._require_pool().restart()
            print(self.pool.status())
        elif cmd == "status":
            print(self.pool.status() if self.pool and not self.pool.closed
                  else "RankPool: none running (%ranks start N starts one).")
        elif cmd == "use":
            pool = self.shell.user_ns.get(args.names[0]) if len(args.names) == 1 else None
            if not isinstance(pool, RankPool):
                raise UsageError("%ranks use POOL needs the name of one labutils.RankPool variable.")
            self.pool = pool
        elif not args.names:
            raise UsageError(f"%ranks {cmd} needs at least one variable name.\n{USAGE}")
        elif cmd == "fetch":
            values = self._require_pool().exec("", ranks=self._selected(args.ranks),
                                               timeout=args.timeout, fetch=args.names)
            lists = {n: [d[n] for d in values] for n in args.names}
            return lists[args.names[0]] if len(args.names) == 1 else lists
        else:  # push
            missing = [n for n in args.names if n not in self.shell.user_ns]
            if missing:
                raise UsageError(f"%ranks push: {missing} not defined in the notebook.")
            self._require_pool().push(ranks=self._selected(args.ranks), timeout=args.timeout,
                                      **{n: self.shell.user_ns[n] for n in args.names})
        return None

    def _cell(self, line: str, cell: str) -> None:
        args = parse(cell_arguments, line)
        fetch = [n.strip() for n in args.fetch.split(",") if n.strip()]
        pool = self._require_pool()
        selected = self._selected(args.ranks)
        try:
            values = pool.exec(cell, ranks=selected, timeout=args.timeout, output=args.output,
                               fetch=fetch, filename=f"<%%ranks cell {self.cell_number()}>")
        except RankError as exc:
            if not not_attempted(exc, range(pool.world_size) if selected is None else selected):
                raise
            print(NOT_ATTEMPTED, file=sys.stderr, flush=True)
            return
        for name in fetch:
            self.shell.user_ns[name] = [d[name] for d in values]

    def cell_number(self) -> int:
        """The ``In [N]`` number of the cell running now. IPython's displayhook knows it (``Out[N]``
        uses it); ``shell.execution_count`` is already N + 1 while a cell runs in IPython >= 9."""
        hook = getattr(self.shell, "displayhook", None)
        return getattr(hook, "prompt_count", self.shell.execution_count)

    def stop(self, quiet: bool = False) -> None:
        """Close the pool (``%ranks stop``); idempotent."""
        if self.pool is not None and not self.pool.closed:
            self.pool.close()
            if not quiet:
                print("labutils: pool stopped; its ranks have exited.")
        elif not quiet:
            print("labutils: no pool was running.")
        self.pool = None


def load_ipython_extension(ipython) -> None:
    """Register ``%ranks``/``%%ranks`` in this IPython shell."""
    ipython.register_magics(RanksMagics)


def unload_ipython_extension(ipython) -> None:
    """Stop the shell's pool and remove the magics."""
    magics = ipython.magics_manager.registry.pop("RanksMagics", None)
    if magics is not None:
        magics.stop(quiet=True)
    for kind in ("line", "cell"):
        ipython.magics_manager.magics[kind].pop("ranks", None)
