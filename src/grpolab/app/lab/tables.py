"""Plain-text tables for the lab's printed results."""

from __future__ import annotations


def table(header: list[str], rows: list[list], widths: list[int] | None = None) -> str:
    """Plain-text table: first column left-aligned, the rest right-aligned; floats to 4 significant digits."""

    def fmt(v) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(v) for v in row] for row in [header] + rows]
    w = [max(len(c[i]) for c in cells) + 2 for i in range(len(header))]
    lines = []
    for c in cells:
        lines.append(c[0].ljust(w[0]) + "".join(x.rjust(w[i]) for i, x in enumerate(c) if i > 0))
    return "\n".join(lines)
