"""The SLA planner: pool sizes from TTFT and inter-token-gap targets (docs/planner.md).

``profile`` (performance profiles and their files), ``predict`` (next-interval load),
``observe`` (one interval's observation), ``decide`` (the pure sizing decision), ``service``
(the observe -> predict -> decide -> act loop) and ``sweep`` (``pdctl profile``'s
measurement)."""
