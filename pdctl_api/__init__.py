"""pdctl's control-API contract, shared by the controller, the CLI and the console: the
models of every answer and request body (``pdctl_api.schema``) and the one typed client
(``pdctl_api.client``). Depends on pydantic and httpx only, never on ``controller`` or
``dashboard``."""
