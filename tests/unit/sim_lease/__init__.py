"""vLLM 0.32's NixlConnector lease model in the simulated engine, in-process.

A prefill keeps a finished request's KV for ``kv_lease_duration_s`` wall seconds; a decode
engine renews the leases it waits on with heartbeats, reads a handle once, and releases a
handle it will not read (a rejected or aborted request). A read of a handle the prefill no
longer tracks still succeeds on the decode side; only the prefill counts and logs it.

The package: ``harness`` (a prefill and a decode engine joined by a recording side channel),
``test_prefill`` (the prefill side: leases, heartbeats, late and repeated reads, releases),
``test_side_channel`` (malformed side-channel bodies) and ``test_decode`` (the decode side:
releases, heartbeats, aborts).
"""
