"""Reference solutions for lab 07's exercises: ``%%ranks`` cells, as the text each rank runs. Peek only
after trying!"""

# Exercise 1: every rank ends with the mean of all ranks' ``rank``, from one all_reduce (SUM, then divide).
MEAN_RANK = """\
t = torch.tensor([float(rank)], device=device)
dist.all_reduce(t)
mean_rank = t.item() / world_size
"""

# Exercise 2: every rank ends with [0, 1, 4, ...], every rank's rank ** 2 in rank order, from one all_gather.
SQUARES = """\
mine = torch.tensor([rank ** 2], device=device)
parts = [torch.zeros_like(mine) for _ in range(world_size)]
dist.all_gather(parts, mine)
squares = [int(p.item()) for p in parts]
"""
