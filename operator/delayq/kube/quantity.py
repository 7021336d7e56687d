"""Kubernetes resource quantities (`512Mi`, `1Gi`, `1.5G`, `1e9`, `100m`) as exact numbers.

The grammar is the API server's (`k8s.io/apimachinery/pkg/api/resource`): a signed decimal
number, then a binary suffix (Ki..Ei), a decimal one (n, u, m, none, k, M..E) or an exponent
(`e3`, `E-2`). The operator reads the Redis container's memory limit with it to size `maxmemory`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity; ValueError naming it when it is not one."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 512Mi, 1Gi, 1.5G)")
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * (1 << (10 * _BINARY[suffix]))
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def memory_bytes(text: str) -> int:
    """A memory quantity in whole bytes, rounded up as Kubernetes does."""
    return math.ceil(parse_quantity(text))
