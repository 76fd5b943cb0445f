"""Id lists as the command line writes them: ``'3,5,7'``, ``'0-9,15'``, ``'all'``; and number lists."""

from __future__ import annotations

import math
import re

from tl_query_lens.errors import InputError

_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
MAX_IDS = 10_000_000  # a range larger than this is a typo, not a request


def parse_ranges(text: str, upper: int | None, what: str) -> list[int]:
    """``'3,5,7'`` or ``'0-9,15'`` → sorted ids; each must lie in ``0..upper-1`` (when ``upper`` is given).

    Raises:
        InputError: empty text or item, a malformed item (``'3-'``, ``'a'``), a reversed range (``'5-3'``), or ids
            out of range (the message names the option, the bad items and the valid range).
    """
    if not text.strip():
        raise InputError(f"{what} is empty; give ids such as '3', '0-9' or '0-9,15'.")
    spans = []
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise InputError(
                f"{what} {text!r}: {item.strip()!r} is not an id or a range lo-hi; write e.g. '3', '0-9' or '0-9,15'."
            )
        lo = int(match[1])
        hi = int(match[2]) if match[2] is not None else lo
        if hi < lo:
            raise InputError(
                f"{what} {text!r}: the range {item.strip()!r} is empty (start after end); did you mean '{hi}-{lo}'?"
            )
        spans.append((lo, hi))
    if upper is not None:
        bad = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in spans if hi >= upper]
        if bad:
            valid = f"0..{upper - 1}" if upper > 0 else "none"
            raise InputError(f"{what} {', '.join(bad[:10])} out of range; valid: {valid}.")
    if sum(hi - lo + 1 for lo, hi in spans) > MAX_IDS:
        raise InputError(f"{what} {text!r} asks for more than {MAX_IDS:,} ids; give a smaller range.")
    return sorted({i for lo, hi in spans for i in range(lo, hi + 1)})


def parse_layers(text: str, n_layers: int | None, what: str = "--layers") -> list[int]:
    """``'3,5,7'``, ``'0-29'`` or ``'all'`` → sorted layers, checked against ``n_layers`` (when known)."""
    if text.strip() == "all":
        return list(range(n_layers)) if n_layers is not None else []
    return parse_ranges(text, n_layers, what)


def parse_features(text: str, d_sae: int | None, what: str = "--features") -> list[int] | None:
    """``'0-9,15'`` → feature ids checked against the dictionary width; ``'all'`` → None (every feature)."""
    return None if text.strip() == "all" else parse_ranges(text, d_sae, what)


def parse_floats(text: str, what: str, *, positive: bool = True) -> list[float]:
    """``'0.25,0.5'`` → floats (finite, > 0 when ``positive``)."""
    values = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise InputError(f"{what} {text!r}: {item.strip()!r} is not a number; write e.g. '0.25,0.5'.") from None
        if not math.isfinite(value) or (positive and value <= 0):
            raise InputError(f"{what} {text!r}: {item.strip()!r} must be a finite number > 0.")
        values.append(value)
    return values
