"""Kubernetes resource quantities (`512Mi`, `1Gi`, `1.5G`, `1e9`, `100m`) as exact numbers.

The grammar is the API server's (`k8s.io/apimachinery/pkg/api/resource`): a signed decimal
number, then a binary suffix (Ki..Ei), a decimal one (n, u, m, none, k, M..E) or an exponent
(`e3`, `E-2`), with two bounds of delayq's: at most `MAX_QUANTITY_LENGTH` characters and an
exponent of at most two digits. A tenant writes these (`spec.redis.resources`), and the exact
value of `1e999999999` is a billion-digit integer: computing it held the operator's event loop
for hours. The CRD's `QUANTITY_PATTERN` says the same to the API server. As the API server
does, a value beyond 2^63 - 1 is capped to it. The operator reads the Redis container's memory
limit with it to size `maxmemory`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
#: The longest quantity taken, in characters (the CRD's maxLength too).
MAX_QUANTITY_LENGTH = 64
#: The grammar, anchored, as the CRD's `pattern` too (a JSON-schema regex: no named groups):
#: group 1 the signed number, group 2 the suffix or exponent.
QUANTITY_PATTERN = (
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)
#: The largest magnitude the API server represents; it caps a larger quantity to it.
MAX_QUANTITY = 2**63 - 1


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity (capped at MAX_QUANTITY as the API server does);
    ValueError naming it when it is not one delayq takes."""
    stripped = text.strip()
    match = _QUANTITY.fullmatch(stripped) if len(stripped) <= MAX_QUANTITY_LENGTH else None
    if match is None:
        raise ValueError(
            f"{text[:MAX_QUANTITY_LENGTH]!r} is not a Kubernetes quantity (e.g. 512Mi, 1Gi, "
            f"1.5G; at most {MAX_QUANTITY_LENGTH} characters, an exponent of at most two digits)"
        )
    number = Fraction(match[1])
    suffix = match[2] or ""
    if suffix in _BINARY:
        value = number * (1 << (10 * _BINARY[suffix]))
    else:
        exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
        value = number * Fraction(10) ** exponent
    bound = Fraction(MAX_QUANTITY)
    return max(-bound, min(value, bound))


def memory_bytes(text: str) -> int:
    """A memory quantity in whole bytes, rounded up as Kubernetes does."""
    return math.ceil(parse_quantity(text))
