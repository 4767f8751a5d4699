"""The CEL adapter: DRA device selectors evaluated like the scheduler does, in a real CEL engine.

The engine is cel-expr-python (Google's cel-cpp); reference/allocator-and-cel.md §5 explains the
choice. It is hidden behind `Evaluator`, and this module fills what upstream's environment
(`k8s.io/dynamic-resource-allocation/cel`, StoredExpressions flavour) has and the engine lacks:

- **the `device` variable**: `driver`, `attributes[domain][id]` (a name without a domain belongs
  to the driver's domain; split at the first `/`), `capacity[domain][id]` as quantities, and
  `allowMultipleAllocations` (false unless the slice says otherwise);
- **the unknown-domain default**: in Go `device.attributes["other.com"]` is an empty map, not an
  error. The engine only has plain maps, so every `device.attributes[X]` / `device.attributes.X`
  (and the same for `capacity`) is rewritten to `device.attributes[?X].orValue({})` by a small
  tokenizer that knows CEL string literals and comments; `in`, `size()` and macros are untouched;
- **quantity and semver**: values are tagged maps (`{"__q__": exact decimal}`,
  `{"__semver__": "M.m.p[-pre]"}`) with upstream's functions and members registered on maps;
  `==` between two tagged values compares them like Go does (Quantity.Equal, Version.EQ);
- **eager attribute conversion**: a version attribute that is not strict semver, or an attribute
  without a value, makes every selector on that device an error, as in Go;
- **errors are errors**: compile errors, runtime errors and a non-bool result come back as
  `CelError` with the engine's message, never as "no match" (the scheduler fails the pod's
  whole scheduling attempt on them).

Known differences (documented in docs/guides/kubectl-claimwarden.md): no runtime cost limit; two-variable
comprehensions, sets, lists, URL/IP libraries are not there (a compile error names them);
`quantity == "string"` is false here, an error in Go.

Two parts of claimwarden evaluate selectors: the plugin's explain (plugin/selectors.py) and the operator's
HealthPolicy routes (signals/policy.py, a route's CEL selector and DeviceClass). So the adapter lives beside
both, not inside the plugin, and the operator's image carries the engine.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from .quantities import parse_quantity

QUANTITY_TAG = "__q__"
SEMVER_TAG = "__semver__"


class CelError(Exception):
    """A selector that does not compile or errors at run time; the message is the engine's."""


# --- quantities ---------------------------------------------------------------------------------

def _canonical(value: Decimal) -> str:
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


@functools.lru_cache(maxsize=4096)
def quantity_value(text: str) -> dict[str, str]:
    """A quantity as the tagged map the engine carries (cached: slices repeat the same few values)."""
    return {QUANTITY_TAG: _canonical(parse_quantity(text))}


# --- semver -------------------------------------------------------------------------------------

_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
                     r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")


def parse_semver(text: str, normalize: bool = False) -> tuple[int, int, int, str]:
    """(major, minor, patch, prerelease) of a strict semver 2.0.0 string (blang/semver v4 Parse).

    With `normalize` (upstream's `semver(s, true)`): a leading "v" is dropped, missing minor and
    patch are filled with 0 and leading zeros are removed.
    """
    if normalize:
        head = re.match(r"^v?([0-9.]*)(.*)$", text, re.DOTALL)
        core, rest = (head[1], head[2]) if head else (text, "")
        parts = core.split(".") if core else []
        parts += ["0"] * (3 - len(parts))
        text = ".".join(str(int(p)) if p.isdigit() else p for p in parts) + rest
    match = _SEMVER.match(text)
    if not match:
        raise ValueError(f"invalid semver {text!r}")
    return int(match[1]), int(match[2]), int(match[3]), match[4] or ""


@functools.lru_cache(maxsize=4096)
def semver_value(text: str, normalize: bool = False) -> dict[str, str]:
    """A version as the tagged map the engine carries; build metadata is dropped (Version.EQ ignores it)."""
    major, minor, patch, pre = parse_semver(text, normalize)
    return {SEMVER_TAG: f"{major}.{minor}.{patch}" + (f"-{pre}" if pre else "")}


def _pre_key(pre: str) -> tuple[Any, ...]:
    if not pre:
        return ((1,),)  # a release sorts after every pre-release
    return ((0,), *(((0, int(p)) if p.isdigit() else (1, p)) for p in pre.split(".")))


def _semver_key(tagged: Mapping[str, str]) -> tuple[Any, ...]:
    major, minor, patch, pre = parse_semver(tagged[SEMVER_TAG])
    return (major, minor, patch, _pre_key(pre))


# --- the functions upstream's environment adds --------------------------------------------------

def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        if QUANTITY_TAG in value:
            return "quantity"
        if SEMVER_TAG in value:
            return "semver"
    return "map"


def _same_kind(a: Any, b: Any, function: str) -> str:
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a == "map" or kind_a != kind_b:
        raise ValueError(f"no such overload: {kind_a}.{function}({kind_b})")
    return kind_a


def _compare(a: Any, b: Any) -> int:
    kind = _same_kind(a, b, "compareTo")
    if kind == "quantity":
        x, y = Decimal(a[QUANTITY_TAG]), Decimal(b[QUANTITY_TAG])
    else:
        x, y = _semver_key(a), _semver_key(b)  # type: ignore[assignment]
    return (x > y) - (x < y)


def _quantity_only(value: Any, function: str) -> Decimal:
    if _kind(value) != "quantity":
        raise ValueError(f"no such overload: {_kind(value)}.{function}()")
    return Decimal(value[QUANTITY_TAG])


def _semver_only(value: Any, function: str) -> tuple[int, int, int, str]:
    if _kind(value) != "semver":
        raise ValueError(f"no such overload: {_kind(value)}.{function}()")
    return parse_semver(value[SEMVER_TAG])


def _as_integer(value: Any) -> int:
    number = _quantity_only(value, "asInteger")
    if number != number.to_integral_value() or not -(2**63) <= number < 2**63:
        raise ValueError("cannot convert value to integer")
    return int(number)


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except ValueError:
        return False
    return True


def _add(a: Any, b: Any) -> dict[str, str]:
    x = _quantity_only(a, "add")
    y = Decimal(b) if isinstance(b, int) else _quantity_only(b, "add")
    return {QUANTITY_TAG: _canonical(x + y)}


def _sub(a: Any, b: Any) -> dict[str, str]:
    x = _quantity_only(a, "sub")
    y = Decimal(b) if isinstance(b, int) else _quantity_only(b, "sub")
    return {QUANTITY_TAG: _canonical(x - y)}


def _functions() -> list[Any]:
    T = cel.Type
    M, S, B, I = T.MAP, T.STRING, T.BOOL, T.INT  # noqa: E741

    def decl(name: str, *overloads: tuple[str, Any, list[Any], bool, Callable[..., Any]]) -> Any:
        return cel.FunctionDecl(name, [cel.Overload(oid, ret, params, is_member=member, impl=impl)
                                       for oid, ret, params, member, impl in overloads])

    return [
        decl("quantity", ("quantity_string", M, [S], False, quantity_value)),
        decl("isQuantity", ("isQuantity_string", B, [S], False, _is_quantity)),
        decl("semver", ("semver_string", M, [S], False, semver_value),
             ("semver_string_bool", M, [S, B], False, semver_value)),
        decl("isSemver", ("isSemver_string", B, [S], False, _is_semver),
             ("isSemver_string_bool", B, [S, B], False, _is_semver)),
        decl("compareTo", ("map_compareTo_map", I, [M, M], True, _compare)),
        decl("isGreaterThan", ("map_isGreaterThan_map", B, [M, M], True, lambda a, b: _compare(a, b) > 0)),
        decl("isLessThan", ("map_isLessThan_map", B, [M, M], True, lambda a, b: _compare(a, b) < 0)),
        decl("sign", ("map_sign", I, [M], True,
                      lambda a: (lambda v: (v > 0) - (v < 0))(_quantity_only(a, "sign")))),
        decl("asInteger", ("map_asInteger", I, [M], True, _as_integer)),
        decl("isInteger", ("map_isInteger", B, [M], True,
                           lambda a: (lambda v: v == v.to_integral_value() and -(2**63) <= v < 2**63)(
                               _quantity_only(a, "isInteger")))),
        decl("asApproximateFloat", ("map_asApproximateFloat", T.DOUBLE, [M], True,
                                    lambda a: float(_quantity_only(a, "asApproximateFloat")))),
        decl("add", ("map_add_map", M, [M, M], True, _add), ("map_add_int", M, [M, I], True, _add)),
        decl("sub", ("map_sub_map", M, [M, M], True, _sub), ("map_sub_int", M, [M, I], True, _sub)),
        decl("major", ("map_major", I, [M], True, lambda a: _semver_only(a, "major")[0])),
        decl("minor", ("map_minor", I, [M], True, lambda a: _semver_only(a, "minor")[1])),
        decl("patch", ("map_patch", I, [M], True, lambda a: _semver_only(a, "patch")[2])),
    ]


# --- the unknown-domain rewrite -----------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?
      (?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<space>\s+)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


def _tokens(expression: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(expression)]


def rewrite_unknown_domains(expression: str) -> str:
    """`device.attributes[X]` → `device.attributes[?X].orValue({})`, also `.X` and for `capacity`.

    Go's maps return an empty map for a domain the device does not have (§3.1 of the reference);
    the rewrite gives the same, and leaves `"d" in device.attributes`, `size(...)` and macros as
    they are (they see the real keys in Go too).
    """
    tokens = _tokens(expression)
    code = [i for i, (kind, _) in enumerate(tokens) if kind not in ("space", "comment")]
    out = [text for _, text in tokens]
    for position, index in enumerate(code):
        if tokens[index] != ("ident", "device"):
            continue
        if position > 0 and tokens[code[position - 1]][1] == ".":
            continue  # `x.device`, not our variable
        rest = code[position + 1:]
        if len(rest) < 3 or tokens[rest[0]][1] != "." or tokens[rest[1]][1] not in ("attributes", "capacity"):
            continue
        after = rest[2]
        if tokens[after][1] == "[":
            depth, end = 0, None
            for j in rest[2:]:
                if tokens[j][1] in "[({":
                    depth += 1
                elif tokens[j][1] in "])}":
                    depth -= 1
                    if depth == 0:
                        end = j
                        break
            if end is None or (after + 1 < len(tokens) and tokens[after + 1][1] == "?"):
                continue
            out[after] = "[?"
            out[end] = "].orValue({})"
        elif tokens[after][1] == "." and len(rest) > 3 and tokens[rest[3]][0] == "ident":
            name_index = rest[3]
            following = rest[4] if len(rest) > 4 else None
            if following is not None and tokens[following][1] == "(":
                continue  # a member call on the map, e.g. device.attributes.size()
            out[after] = "[?"
            out[name_index] = f'"{tokens[name_index][1]}"].orValue({{}})'
    return "".join(out)


# --- the device variable ------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceInput:
    """The `device` variable of one device, or why every selector on it errors (Go converts eagerly)."""

    value: dict[str, Any]
    error: str | None = None


def device_input(driver: str, device: Mapping[str, Any], *, allow_multiple: bool = False) -> DeviceInput:
    """Build the CEL input of a ResourceSlice device (spec.devices[] entry) published by `driver`."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, _, ident = name.partition("/") if "/" in name else (driver, "", name)
        attribute = attribute or {}
        if "int" in attribute and attribute["int"] is not None:
            value: Any = int(attribute["int"])
        elif "bool" in attribute and attribute["bool"] is not None:
            value = bool(attribute["bool"])
        elif "string" in attribute and attribute["string"] is not None:
            value = str(attribute["string"])
        elif "version" in attribute and attribute["version"] is not None:
            try:
                value = semver_value(str(attribute["version"]))
            except ValueError as exc:
                return DeviceInput({}, f"attribute {name}: {exc}")
        else:
            return DeviceInput({}, f"attribute {name}: unsupported attribute value")
        attributes.setdefault(domain, {})[ident] = value
    capacity: dict[str, dict[str, Any]] = {}
    for name, entry in (device.get("capacity") or {}).items():
        domain, _, ident = name.partition("/") if "/" in name else (driver, "", name)
        try:
            capacity.setdefault(domain, {})[ident] = quantity_value(str((entry or {}).get("value", "0")))
        except ValueError as exc:
            return DeviceInput({}, f"capacity {name}: {exc}")
    return DeviceInput({"driver": driver, "attributes": attributes, "capacity": capacity,
                        "allowMultipleAllocations": bool(allow_multiple)})


# --- the evaluator ------------------------------------------------------------------------------

class Program:
    """One compiled selector."""

    def __init__(self, expression: str, compiled: Any) -> None:
        self.expression = expression
        self._compiled = compiled

    def matches(self, device: DeviceInput) -> bool:
        """True or False, or CelError with the engine's message (as upstream's "CEL runtime error")."""
        if device.error:
            raise CelError(device.error)
        try:
            result = self._compiled.eval(data={"device": device.value})
        except Exception as exc:  # the engine raises for errors inside our Python functions
            raise CelError(_message(exc)) from None
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            raise CelError(_message(result.value()))
        raise CelError(f"CEL result of type {kind.name().lower()} could not be converted to bool")


def _message(error: Any) -> str:
    return _clean_message(str(error))


@functools.lru_cache(maxsize=1024)
def _clean_message(error: str) -> str:
    text = re.sub(r"^[A-Z_]+: ", "", " ".join(str(error).split()))
    # cel-cpp says `Key not found in map : "x"` where cel-go says `no such key: x`
    return re.sub(r'^Key not found in map : "(.*)"$', r"no such key: \1", text)


class Evaluator:
    """Compiles selectors once (a cache keyed by expression, like upstream's cel.Cache)."""

    def __init__(self) -> None:
        self._env = cel.NewEnv(
            variables={"device": cel.Type.DYN},
            extensions=[ext_optional.ExtOptional(), ext_bindings.ExtBindings(), ext_strings.ExtStrings(version=2)],
            functions=_functions())
        self._programs: dict[str, Program | CelError] = {}

    def compile(self, expression: str) -> Program:
        """The compiled selector, or CelError("compile error: …")."""
        cached = self._programs.get(expression)
        if cached is None:
            cached = self._compile(expression)
            self._programs[expression] = cached
        if isinstance(cached, CelError):
            raise cached
        return cached

    def _compile(self, expression: str) -> Program | CelError:
        if not expression.strip():
            return CelError("compile error: CEL expression empty")
        try:
            compiled = self._env.compile(rewrite_unknown_domains(expression))
        except Exception as exc:
            return CelError(f"compile error: {_compile_message(exc, expression)}")
        returns = compiled.return_type()
        if returns != cel.Type.BOOL and returns != cel.Type.DYN:
            return CelError(f"compile error: must evaluate to bool or the unknown type, not {returns.name()}")
        return Program(expression, compiled)


def _compile_message(exc: Exception, expression: str) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip() and not line.lstrip().startswith("|")]
    text = " ".join(" ".join(lines).split())
    text = re.sub(r"^INVALID_ARGUMENT: ", "", text)
    text = re.sub(r"\s*\[INVALID_ARGUMENT\]$", "", text)
    return text.replace(" (in container '')", "") or expression
