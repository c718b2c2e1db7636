"""The data plane: the routing table, the two-hop proxy, hop bodies, SSE, TTFT accounting
and the HTTP/1.1 client to the engines."""
