"""What-if: the fleet run as a discrete-event simulation on a modelled clock.

The same engine model the live simulated engine runs (``controller.engines.sim.scheduler``:
continuous batching, chunked prefill, KV capacity and preemption, the prefix cache;
``controller.engines.sim.cost``: the roofline step time; the KV link of ``pdctl_api.profiles``)
driven by an event queue instead of wall-clock sleeps, with the router's own routing table,
policies and hand-off decision (``controller.router``) choosing where each request goes. It
answers in seconds what a trace would do to a layout (``simulate``) and searches layouts for
the most goodput per accelerator (``search``, ``pdctl plan``).
"""
