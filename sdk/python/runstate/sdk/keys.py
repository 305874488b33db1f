"""Keys of `once` calls and queue jobs: `<name>:<first 32 hex digits of sha256(canonical JSON)>`.

Canonical JSON is RFC 8785 (JCS), so every SDK that hashes the same JSON value gets the same key:
object members sorted by their names' UTF-16 code units, no whitespace, strings escaped as
ECMAScript's JSON.stringify does (only `"`, `\\` and control characters; everything else as UTF-8),
numbers written as ECMAScript writes a double (`1e+21`, `1.5e-7`, `-0` as `0`). A Python int is a
double to JCS: up to 2**53 it is exact; beyond, it is rounded to the nearest double first
(2**53 + 1 is written `9007199254740992`), as JavaScript would have it.

What is hashed:

- `once` without `key=`: the call's arguments bound to the function's signature, defaults applied,
  as a JSON list of the parameter values in declaration order. So `f("acme")` and `f(name="acme")`
  give the same key, and a TypeScript `f('acme')` gives it too. A `*args` parameter contributes one
  list at its position (`[]` when nothing extra was passed), a `**kwargs` parameter one object
  (`{}` when none), so `def f(*items)` called as `f(1, 2)` hashes `[[1, 2]]`.
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


def argument_values(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The call's arguments as the list that is hashed: bound to `signature` with defaults applied,
    one value per parameter in declaration order (`*args` as a list, `**kwargs` as an object).

    Raises TypeError, as the call itself would, when the arguments do not fit the signature.
    """
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values: list[Any] = []
    for name, parameter in signature.parameters.items():
        value = bound.arguments[name]
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            value = list(value)
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            value = dict(value)
        values.append(value)
    return values


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
    values = argument_values(signature, args, kwargs)
    parameter_names = list(signature.parameters)
    converted = [
        json_value(value, what=f"argument {parameter_names[index]!r} of {name}") for index, value in enumerate(values)
    ]
    return make_key(name, converted)
