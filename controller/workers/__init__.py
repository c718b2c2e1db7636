"""Router workers: the data plane on more than one core (``controller.data_workers``).

The controller process (the *brain*) owns the fleet, the control API, the request log and
every record's consumers, and serves the data plane too. With ``data_workers: N`` it starts
N - 1 worker processes (``worker``) that accept client connections on the same address
(``SO_REUSEPORT``: the kernel spreads connections over the processes) and route the OpenAI
requests themselves, each with its own routing table fed by the brain over a Unix socket
(``channel``): live routing settings, each pool's ready instances and the other processes'
load. A worker sends the brain what it did: each request's admission and record, its decode
hops (the silent-fallback watch), unreachable engines, its load and its metrics
(``hub``). Every other path a worker receives is relayed to the brain (``relay``). The
brain's supervisor (``pool``) restarts a worker that dies and records its requests in
flight as failed.
"""
