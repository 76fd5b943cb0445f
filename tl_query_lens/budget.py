"""A memory budget: sizes set by options are checked against the memory there is, before anything is allocated.

Every allocation whose size an option sets (``atlas --n-top`` / ``--band-sample``, ``certify --bins``,
``readout fit --width`` / ``--batch-rows``, ``saes train --d-sae``) is estimated in bytes by the command before
its work starts (before the model loads where the model's sizes are known then: the embedded model's are) and
refused when it exceeds the budget: ``TLQL_MAX_MEMORY`` (e.g. ``8G``; the command line's ``--max-memory`` sets it)
or else the memory available now (``MemAvailable``). The estimates count what the option sizes (tensors and their
optimiser state), not the model or the libraries, so they are lower bounds: a refusal is always warranted.

This module imports nothing heavy.
"""

from __future__ import annotations

import os
import re

from tl_query_lens.errors import InputError

ENV = "TLQL_MAX_MEMORY"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, what: str = ENV) -> int:
    """Bytes of ``'8G'``, ``'512M'``, ``'1.5T'`` or a plain number of bytes; :class:`InputError` naming ``what``."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not found or float(found.group(1)) <= 0:
        raise InputError(f"{what}={text!r} is not a size; write e.g. 8G, 512M or a number of bytes.")
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])


def budget() -> tuple[int | None, str]:
    """``(bytes, where the figure comes from)``: ``TLQL_MAX_MEMORY`` if set, else the memory available now (None
    where the system does not say)."""
    limit = os.environ.get(ENV)
    if limit:
        return parse_size(limit), f"{ENV} / --max-memory"
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available memory"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available memory"
    except (ValueError, OSError, AttributeError):
        return None, "available memory"


def human(n: float) -> str:
    """``1.5 GiB``-style text of a byte count."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def check_memory(needs: dict[str, float], what: str) -> None:
    """Refuse ``what`` when the bytes in ``needs`` (option text → estimated bytes it sizes) exceed the budget; the
    message names the largest need and the budget's source, and the fix."""
    total = sum(needs.values())
    limit, source = budget()
    if limit is None or total <= limit:
        return
    option, most = max(needs.items(), key=lambda item: item[1])
    raise InputError(
        f"{what} would allocate about {human(total)} ({option}: {human(most)}), more than the {human(limit)} of "
        f"{source}; lower {option.split('=')[0].split()[0]}, or raise the budget with --max-memory / {ENV} if "
        "the memory exists. Nothing was computed."
    )
