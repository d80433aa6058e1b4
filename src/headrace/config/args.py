"""Settings as command-line flags: one `--flag` per dataclass field, and back."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

C = TypeVar("C")


def add_config_args(
    parser: argparse.ArgumentParser, cls: type[Any], skip: tuple[str, ...] = ()
) -> None:
    """Add one `--flag` per field of the dataclass `cls` (but the fields named in `skip`)."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _field_type(f)
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata.get("help", "")}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif str(f.type).startswith("tuple"):  # a repeatable flag
            kwargs.update(action="append", type=str, default=None)
        else:
            kwargs["type"] = kind
        parser.add_argument(flag, dest=f.name, **kwargs)


def config_from_args(cls: type[C], args: argparse.Namespace) -> C:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def _field_type(f: dataclasses.Field[Any]) -> type:
    text = str(f.type)
    for name, kind in (("bool", bool), ("int", int), ("float", float)):
        if text.startswith(name):
            return kind
    return str
