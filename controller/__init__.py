"""pdctl's controller: the fleet of engines, the router, the control API and the CLI.

See docs/architecture.md for the pieces and how a request and a pool change move through
them."""
