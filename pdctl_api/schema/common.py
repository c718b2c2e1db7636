"""What every part of the contract shares: the enums of roles, instance states and request
paths, the base of every answer (``Public``) and of every PATCH body (``UpdateBody``; its
fields are those of the answer it changes, made optional by ``changes_of``), and the one error
shape (``ErrorPublic``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar, Union, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model, model_validator
from pydantic.json_schema import SkipJsonSchema


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class InstanceState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"

    @classmethod
    def terminal_states(cls) -> frozenset[InstanceState]:
        return frozenset({cls.STOPPED, cls.FAILED})

    @property
    def terminal(self) -> bool:
        return self in self.terminal_states()

    @property
    def routable(self) -> bool:
        """Only a ready instance takes new requests."""
        return self is InstanceState.READY

    @property
    def holds_accelerators(self) -> bool:
        return not self.terminal

    @property
    def drainable(self) -> bool:
        """The controller accepts an operator's drain of a ready or starting instance."""
        return self in (InstanceState.READY, InstanceState.STARTING)


class RequestPath(enum.StrEnum):
    DISAGGREGATED = "disaggregated"
    COLOCATED = "colocated"


class Public(BaseModel):
    """An answer of the API. Unknown fields (a newer controller's) are ignored."""

    model_config = ConfigDict(extra="ignore")


Value = TypeVar("Value")
# A field of a PATCH body: the setting's own type (bounds, description), or left out. The
# JSON schema does not offer null: an explicit null is refused (``UpdateBody``).
Maybe = Union[Value, SkipJsonSchema[None]]  # noqa: UP007 - `Value | ...`: no alias to mypy
_LEFT_OUT: Any = get_args(Maybe)[1]  # SkipJsonSchema[None], for the types built at run time


def _takes_int(annotation: Any) -> bool:
    """An ``int`` field, or one of ``int`` or left out (``Maybe[int]``), bounds aside."""
    if annotation is int:
        return True
    return any(_takes_int(a) for a in get_args(annotation) if a is not type(None))


class UpdateBody(BaseModel):
    """A PATCH body: only the fields to change, at least one; strict (a number as a string,
    a fractional number for an integer, a boolean for a number, an unknown field, an explicit
    null: all refused); numbers finite and bounded (each field's bounds are its setting's).
    An integer written with a zero fraction (``2.0``) is that integer, as JSON Schema's
    ``integer`` says."""

    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"minProperties": 1})

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = [k for k, v in data.items() if v is None and k in cls.model_fields]
            if nulls:
                raise ValueError(f"{', '.join(nulls)}: null is not a value; leave the field "
                                 "out to keep it")
            whole = {k: int(v) for k, v in data.items() if type(v) is float and v.is_integer()
                     and k in cls.model_fields and _takes_int(cls.model_fields[k].annotation)}
            if whole:
                return {**data, **whole}
        return data


Body = TypeVar("Body", bound=UpdateBody)


def changes_of(model: type[BaseModel], *names: str) -> Callable[[type[Body]], type[Body]]:
    """A class decorator: the PATCH body gets, as optional fields, the fields ``names`` of
    ``model`` (all of them when none are named), each with its type, bounds and
    description."""
    def derive(body: type[Body]) -> type[Body]:
        hints = get_type_hints(model, include_extras=True)  # the Annotated types, bounds kept
        fields: dict[str, Any] = {name: (hints[name] | _LEFT_OUT, None)
                                  for name in names or tuple(model.model_fields)}
        return create_model(body.__name__, __base__=body, __module__=body.__module__,
                            __doc__=body.__doc__, **fields)
    return derive


class ErrorPublic(BaseModel):
    """Every control-API error: ``detail`` says why; ``field`` names the offending field of a
    refused change when the controller knows it."""

    detail: str
    field: str | None = None
