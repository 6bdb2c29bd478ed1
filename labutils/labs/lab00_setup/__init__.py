"""Lab 00 (setup): ``measure`` -- copy bandwidth of one process and the cost of starting ranks."""
