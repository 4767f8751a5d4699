"""Kubernetes quantities ("40Gi", "500m", "1e3") as exact numbers, like apimachinery's resource.ParseQuantity.

Shared by the operator (a device's counters, health/domains.py) and the plugin's CEL adapter.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([numkMGTPE])|([eE][+-]?\d+))?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}


def parse_quantity(text: str) -> Decimal:
    """The exact value of a Kubernetes quantity ("1Gi", "500m", "1e3"), like resource.ParseQuantity."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not match or text != text.strip():
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    number, binary, decimal, exponent = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"invalid quantity {text!r}") from exc
    if binary:
        value *= _BINARY[binary]
    elif exponent:
        value *= Decimal(10) ** int(exponent[1:])
    else:
        value *= _DECIMAL[decimal or ""]
    return value
