"""The engines' KV events as the source of truth for where prefix blocks live.

``wire`` decodes (and encodes) what vLLM's ZMQ publisher sends, ``hashing`` computes the
controller's own chain hashes of token blocks (and vLLM's, for the simulated engine),
``index`` is the pure block index per instance (decisions returned as data), and
``subscriber`` is the asyncio ZMQ subscriber that feeds it, one per instance."""
