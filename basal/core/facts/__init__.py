"""``facts: "auto"``: computed calendar and money facts appended to a Polish state (docs/extensions.md §5).

Modules, in the order the block is built: `patterns` (data), `scan` (linear-time matching), `sentences`,
`amounts` (Decimal formats), `calendar` (part A), `vat` (part B), `stated`, `exchange`, `money`, `compare`
(part C), `inject` (assembly and errors), `request` (the request field of both dialects).
"""

from basal.core.facts.inject import FactsError, fact_lines, inject

__all__ = ["FactsError", "fact_lines", "inject"]
