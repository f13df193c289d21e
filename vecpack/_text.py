"""Text every layer prints: one rule for counts, so a report reads the same from any layer."""

from __future__ import annotations


def plural(count: float, one: str, many: str | None = None, *, rate: bool = False) -> str:
    """``count`` with its noun, singular for exactly one: every count vecpack prints goes through this.

    ``rate=True`` formats a rate (no decimals).

    >>> plural(1, "pack"), plural(2000, "pack"), plural(1, "entry", "entries")
    ('1 pack', '2,000 packs', '1 entry')
    >>> plural(0.6, "row/s", "rows/s", rate=True)
    '1 row/s'
    """
    text = f"{count:,.0f}" if rate else f"{count:,}"
    return f"{text} {one if text == '1' else (many or one + 's')}"
