"""DRF serializer pieces every API of the site uses: serializers that refuse unknown fields,
JSON-only scalar fields (DRF coerces "3", 3.0 and "yes"), and DRF serializers derived from
msgspec structs, so a schema documents exactly what a C decoder accepts."""

from __future__ import annotations

from typing import Any

import msgspec
from rest_framework import serializers


class StrictSerializer(serializers.Serializer):
    """Rejects unknown fields, naming them."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                name = sorted(unknown)[0]
                raise serializers.ValidationError({name: [f"unknown field {name!r}"]})
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: no strings, floats or booleans (DRF coerces "3" and 3.0)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError("must be an integer")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean only (DRF accepts "yes", 1, "on", ...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("must be a boolean")
        return data


class FiniteFloatField(serializers.FloatField):
    """A finite JSON number (no strings, booleans, NaN or infinities)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise serializers.ValidationError("must be a number")
        value = super().to_internal_value(data)
        if value != value or value in (float("inf"), float("-inf")):
            raise serializers.ValidationError("must be a finite number")
        return value


def struct_serializer(struct: type[msgspec.Struct], name: str) -> type[serializers.Serializer]:
    """A DRF serializer documenting ``struct`` field by field: types, bounds, nullability,
    defaults and descriptions come from msgspec's type info."""
    fields: dict[str, serializers.Field] = {}
    for f in msgspec.inspect.type_info(struct).fields:  # type: ignore[attr-defined]
        tp, help_text = f.type, None
        if isinstance(tp, msgspec.inspect.Metadata):
            help_text = (tp.extra_json_schema or {}).get("description")
            tp = tp.type
        kwargs: dict[str, Any] = {"required": f.required, "help_text": help_text}
        if isinstance(tp, msgspec.inspect.UnionType):
            others = [t for t in tp.types if not isinstance(t, msgspec.inspect.NoneType)]
            kwargs["allow_null"] = len(others) < len(tp.types)
            tp = others[0]
        if not f.required and f.default not in (None, msgspec.NODEFAULT):
            kwargs["default"] = f.default
        fields[f.name] = _field_for(tp, **kwargs)
    return type(name, (StrictSerializer,), fields)


def _field_for(tp: Any, **kwargs: Any) -> serializers.Field:
    i = msgspec.inspect
    if isinstance(tp, i.Metadata):  # bounds inside a union (``Annotated[str, Meta(...)] | None``)
        if not kwargs.get("help_text"):
            kwargs["help_text"] = (tp.extra_json_schema or {}).get("description")
        return _field_for(tp.type, **kwargs)
    if isinstance(tp, i.AnyType):
        return serializers.JSONField(**kwargs)
    if isinstance(tp, i.IntType):
        return serializers.IntegerField(min_value=tp.ge, max_value=tp.le, **kwargs)
    if isinstance(tp, i.FloatType):
        return FiniteFloatField(min_value=tp.ge, max_value=tp.le, **kwargs)
    if isinstance(tp, i.BoolType):
        return serializers.BooleanField(**kwargs)
    if isinstance(tp, i.DateTimeType):
        return serializers.DateTimeField(**kwargs)
    if isinstance(tp, i.StrType):
        return serializers.CharField(max_length=tp.max_length, allow_blank=not tp.min_length, **kwargs)
    if isinstance(tp, i.LiteralType):
        return serializers.ChoiceField(choices=list(tp.values), **kwargs)
    if isinstance(tp, i.ListType):
        return serializers.ListField(child=_field_for(tp.item_type), **kwargs)
    if isinstance(tp, i.DictType):
        return serializers.DictField(**kwargs)
    if isinstance(tp, i.StructType):  # a nested struct (e.g. serving.reuse)
        return struct_serializer(tp.cls, tp.cls.__name__)(**kwargs)
    raise TypeError(f"no serializer field for {tp!r}")
