"""Pull vs push KV hand-off between a real vLLM prefill and decode engine over NIXL (CPU lab).

Starts one prefill (TP1, core 0) and one decode (TP1, core 1) real vLLM CPU engine per mode,
with the product's own command lines (``controller.launchers.vllm.VllmEngineKind``) and the
``kv_transfer_config`` changed in two fields only: ``kv_connector`` (``NixlConnector`` = pull,
``NixlPushConnector`` = push) and ``engine_id`` (a fixed string, so the client knows the
prefill's NIXL engine id before the prefill answers -- push sends both hops at once). Both
pairs run at the same time (both prefills on core 0, both decodes on core 1) and the requests
alternate pull/push one at a time, so both modes see the same contention (each engine's NIXL
progress thread busy-polls; the figures are relative, not absolute).

Per mode and prompt length (random token ids, a new prompt each request, so no prefix-cache
hits) it measures:

* TTFT: client send -> first streamed token of the decode hop. Pull sends the decode hop when
  the prefill hop has answered; push sends both hops at the same moment with the same
  ``X-Request-Id`` (vLLM forms ``cmpl-<id>-0-<8 hex>`` on both engines; the NIXL push worker
  matches P's finished blocks with D's registration on the id less its random suffix).
* hand-off: the prefill hop's answer -> the first decode token.
* correctness: the disaggregated text equals a colocated run of the same prompt on the decode
  engine (sent with a ``cache_salt`` so it cannot reuse the transferred blocks).
* the decode engine's ``/metrics``: ``vllm:prompt_tokens_by_source_total`` by source and
  ``vllm:nixl_num_failed_transfers_total`` deltas.

Then probes (``kv_load_failure_policy: recompute``): decode hops whose ``kv_transfer_params``
name a dead side-channel port (with the prefill's engine id, and with one never seen), or a
wrong engine id at the live port; in push mode also a decode hop sent 2 s before / after its
prefill hop and one whose prefill never comes. For each: HTTP
status, text equality, time, counter deltas, ``usage.prompt_tokens_details.cached_tokens`` and
the per-request ``metrics``.

Run: ``.venv/bin/python -m bench.handoff_lab [--requests N] [--json FILE]``. Needs the lab
model (``pdctl make-model lab-model``). Every engine is started in its own session and its
whole process group is killed on exit. Figures are from a 2-core box where each engine's NIXL
progress thread busy-polls a core: right for correctness and relative comparison only.
"""
