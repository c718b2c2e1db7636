"""What the operator watches beside the request path: Prometheus (its targets and alerting
rules), the service targets, and the KV-integrity watch."""
