"""What fits where, as pure functions over numbers: pool placement and fit checks, KV capacity,
the CPU's engine settings, and the advisor's ratios."""
