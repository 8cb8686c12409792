"""A bundle's variants as a table: size, worst parity error against its tolerance, task-level quality vs FP32."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def bundle_table(bundle: Any) -> Any:
    """A ``rich.table.Table`` with one row per variant of ``bundle`` (an :class:`~edgecap.runtime.bundle.Bundle`)."""
    from rich.table import Table

    rows = bundle.summary()
    held_out = bundle.manifest.get("held_out") or {}
    caption = f"task-level check on {held_out['set']}" if held_out else "no held-out set: task-level check not run"
    table = Table(title=f"{bundle.name} bundle · {bundle.path}", caption=caption)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("precision", "left"),
        ("MB", "right"),
        ("parity vs torch", "left"),
        ("CIDEr-D", "right"),
        ("Δ vs FP32", "right"),
        ("agreement", "right"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for row in rows:
        if row["parity_passed"] is None:
            parity = "n/a (QDQ: judged on the task)"
        else:
            verdict = "pass" if row["parity_passed"] else "FAIL"
            parity = f"{verdict}: max |err| {_num(row['parity_max_abs'], '.1e')} (atol {_num(row['parity_atol'], 'g')})"
        cider, agreement = row["cider_d"], row["agreement"]
        table.add_row(
            row["precision"],
            f"{row['bytes'] / 1e6:.1f}",
            parity,
            _num(None if cider is None else cider * 100, ".1f"),
            _num(None if row["cider_d_delta"] is None else row["cider_d_delta"] * 100, "+.1f"),
            "—" if agreement is None else f"{agreement:.1%}",
        )
    return table
