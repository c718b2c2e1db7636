"""The data plane: policies that pick instances, the two-hop proxy, TTFT accounting."""
