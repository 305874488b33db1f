"""Keys of `once` calls and queue jobs: `<name>:<first 32 hex digits of sha256(canonical JSON)>`.

Canonical JSON is RFC 8785 (JCS), so every SDK that hashes the same JSON value gets the same key:
object members sorted by their names' UTF-16 code units, no whitespace, strings escaped as
ECMAScript's JSON.stringify does (only `"`, `\\` and control characters; everything else as UTF-8),
numbers written as ECMAScript writes a double (`1e+21`, `1.5e-7`, `-0` as `0`). A Python int is a
double to JCS: up to 2**53 it is exact; beyond, it is rounded to the nearest double first
(2**53 + 1 is written `9007199254740992`), as JavaScript would have it.

What is hashed:

- `once` without `key=`: the arguments as the caller passed them, as the published clients and the
  TypeScript SDK hash them: a JSON list of the positional arguments, then, when any argument is
  passed by keyword, one object of them. Defaults are not applied: `f("acme")` of
  `def f(name, depth=2)` hashes `["acme"]`, which a TypeScript `f('acme')` hashes too, and
  `f("acme", 2)` is another key. An argument passed by keyword counts as positional when every
  parameter before it was passed too, so `f(name="acme")` is `f("acme")`; `*args` are positional
  arguments like any other (`def f(*items)` called as `f(1, 2)` hashes `[1, 2]`) and keyword-only
  and `**kwargs` arguments go into the object (`f("acme", verbose=True)` hashes
  `["acme", {"verbose": true}]`, as a TypeScript `f('acme', { verbose: true })` does).
- `queue`: the input in a list, `[input]`, as the published clients hash it.
- `key=` (of `once` or `queue`): called with the same arguments (the input); a string it returns
  is the key's text as it is, `<name>:<text>` (1 to 255 characters), as the published clients
  have it: `key=lambda company, http: company.domain` gives `research:acme.com`. Any other JSON
  value it returns is hashed (a runstate extension; the published clients refuse it).

JSON values are None, bool, int, float, str, list and dict with str keys. Also accepted and
converted: tuples (lists), dataclass instances (objects of their fields) and objects with a
`model_dump` method such as pydantic models (`model_dump(mode="json")`). Anything else, a float
that is NaN or infinite, a dict key that is not a str, or a str with a lone surrogate raises
ConfigError. `tests/key_vectors.json` holds vectors other SDKs check themselves against.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from runstate.sdk.errors import ConfigError

HASH_HEX_CHARS = 32
# The text a key function returns, used as it is after `<name>:` (the published clients' bound).
KEY_TEXT_CHARS_MAX = 255
# Beyond this, a JSON number is not an exact integer in a double.
EXACT_INT_MAX = 2**53
# Nesting deeper than this is refused rather than recursing without bound.
DEPTH_MAX = 100


def json_value(value: Any, *, what: str = "value") -> Any:
    """`value` as plain JSON data (dict, list, str, int, float, bool, None), converting tuples,
    dataclass instances and objects with `model_dump` (pydantic); ConfigError for anything else."""
    return _convert(value, what, 0)


def _convert(value: Any, path: str, depth: int) -> Any:
    if depth > DEPTH_MAX:
        raise ConfigError(f"{path} is nested more than {DEPTH_MAX} levels deep")
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str):
            _check_text(value, path)
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{path} is {value!r}, which JSON cannot carry")
        return float(value)
    if isinstance(value, Mapping):
        converted: dict[str, Any] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise ConfigError(f"{path} has a key {name!r} that is not a string; JSON object keys are strings")
            _check_text(name, path)
            converted[name] = _convert(item, f"{path}[{name!r}]", depth + 1)
        return converted
    if isinstance(value, (list, tuple)):
        return [_convert(item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _convert(getattr(value, field.name), f"{path}.{field.name}", depth + 1)
            for field in dataclasses.fields(value)
        }
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):
        return _convert(model_dump(mode="json"), path, depth + 1)
    raise ConfigError(
        f"{path} is a {type(value).__name__}, not a JSON value (use str, int, float, bool, None, list, "
        f"tuple, dict, a dataclass or a pydantic model, or pass key= to choose what identifies the call)"
    )


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{path} holds a lone surrogate ({exc.reason}); it is not valid Unicode") from None


def canonical_json(value: Any) -> str:
    """The RFC 8785 (JCS) text of a JSON value (after `json_value`'s conversions)."""
    parts: list[str] = []
    _write(json_value(value), parts)
    return "".join(parts)


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, int):
        out.append(str(value) if -EXACT_INT_MAX <= value <= EXACT_INT_MAX else _number(_as_double(value)))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        out.append("{")
        for index, name in enumerate(sorted(value, key=_utf16_order)):
            if index:
                out.append(",")
            out.append(_string(name))
            out.append(":")
            _write(value[name], out)
        out.append("}")


def _utf16_order(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare as the code-unit sequences do (RFC 8785, 3.2.3).
    return name.encode("utf-16-be")


def _as_double(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ConfigError(f"the integer {value} is too large for a JSON number (a double)") from None


def _string(text: str) -> str:
    # json.dumps with ensure_ascii=False escapes exactly `"`, `\` and U+0000..U+001F, using the
    # short forms where JSON has them and \u00xx (lowercase hex) otherwise, as JSON.stringify does.
    return json.dumps(text, ensure_ascii=False)


def _number(value: float) -> str:
    """A finite double as ECMAScript's Number.prototype.toString writes it (ECMA-262, 6.1.6.1.20)."""
    if value == 0:
        return "0"  # also -0
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript requires.
    text = repr(abs(value))
    mantissa, _, exponent_text = text.partition("e")
    exponent = int(exponent_text) if exponent_text else 0
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    leading_zeros = len(whole + fraction) - len(digits)
    digits = digits.rstrip("0")
    k = len(digits)
    # value = 0.<digits> * 10**n
    n = len(whole) - leading_zeros + exponent
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        power = n - 1
        power_text = f"+{power}" if power >= 0 else str(power)
        body = (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + power_text
    return sign + body


def hash_hex(value: Any) -> str:
    """The first 32 hex digits of sha256 of the canonical JSON of `value` (UTF-8)."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:HASH_HEX_CHARS]


def make_key(name: str, value: Any) -> str:
    """`<name>:<hash_hex(value)>`: the key of a once call or a queue job."""
    return f"{name}:{hash_hex(value)}"


def custom_key(name: str, value: Any, what: str) -> str:
    """The key of what a `key=` function returned: a string as it is (`<name>:<value>`), any
    other JSON value hashed. ConfigError for an empty or over-long string, or a non-JSON value."""
    value = json_value(value, what=what)
    if isinstance(value, str):
        if not 1 <= len(value) <= KEY_TEXT_CHARS_MAX:
            raise ConfigError(f"{what} must be 1 to {KEY_TEXT_CHARS_MAX} characters, got {len(value)}")
        return f"{name}:{value}"
    return make_key(name, value)


def argument_values(
    name: str, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """The call's arguments as the list that is hashed: the positional arguments as passed, then one
    object of the keyword arguments when there are any (defaults are not applied). A keyword argument
    moves into the list when every parameter before it was passed, so a call by name and the same
    call by position are one key. Each value is converted by `json_value` (ConfigError, naming
    the argument and the once function `name`, when it is not a JSON value).

    Raises TypeError, as the call itself would, when the arguments do not fit the signature.
    """
    bound = signature.bind(*args, **kwargs)
    # BoundArguments.args runs up to the first parameter not passed (its `*args` spread out);
    # BoundArguments.kwargs holds the rest, keyword-only and `**kwargs` arguments included.
    labels = _positional_labels(signature, len(bound.args))
    values = [json_value(value, what=f"argument {labels[index]} of {name}") for index, value in enumerate(bound.args)]
    if bound.kwargs:
        values.append({word: json_value(value, what=f"argument {word!r} of {name}") for word, value in bound.kwargs.items()})
    return values


def _positional_labels(signature: inspect.Signature, count: int) -> list[str]:
    """What to call each of `count` positional arguments in an error: `'company'`, `*names[0]`."""
    labels: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            labels.extend(f"*{parameter.name}[{index}]" for index in range(count - len(labels)))
        elif parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            labels.append(repr(parameter.name))
    return labels[:count]


def call_key(
    name: str,
    signature: inspect.Signature,
    key: Callable[..., Any] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    """The key of one call of a once function: of `key(*args, **kwargs)` when `key` is given (see
    custom_key), else the hash of the bound argument values. ConfigError when what is hashed is not
    a JSON value."""
    if key is not None:
        return custom_key(name, key(*args, **kwargs), f"the key of {name}")
    return make_key(name, argument_values(name, signature, args, kwargs))
