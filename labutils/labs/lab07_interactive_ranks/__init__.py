"""Lab 07's harness (a persistent ``RankPool`` and the ``%%ranks`` magic). The work each round trip does
is code in the notebook; here: ``measure`` (timing a pool round trip, a ``%%ranks`` cell and a fresh
launch, and the table of them) and ``claims`` (their verdicts, and those of the pool's fault rules)."""
