"""Usage in money: a model call's cost from the prices in ``usage.prices`` (docs/models-and-usage.md).

Costs are whole millionths of the currency unit (micros): a price is per million tokens, so a
call's cost in micros is exactly ``tokens × price`` for each kind of token, an integer sum in SQL
on both engines (no float drift over a month of rows). A model without a price has no cost: its
tokens are counted as *unpriced* and everything that shows cost says it is unknown for them,
never 0. Prompt tokens read from the provider's cache are billed at ``cached_input`` (else the
input price); the rest at ``input``.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config.sections import ModelPrice

MICROS = 1_000_000
"""Micros in one unit of the currency."""


def cost_micros(
    prices: Mapping[str, ModelPrice], model: str, prompt: int, completion: int, cached: int = 0
) -> int | None:
    """What a call of ``model`` cost, in micros; None when the model has no price."""
    price = prices.get(model)
    if price is None:
        return None
    cached = max(0, min(cached, prompt))
    cached_price = price.input if price.cached_input is None else price.cached_input
    return round((prompt - cached) * price.input + cached * cached_price + completion * price.output)


def money(micros: int, currency: str) -> str:
    """``0.0123 USD``, ``12.35 USD``: cents once it is a unit or more, four decimals below."""
    value = micros / MICROS
    return f"{value:,.2f} {currency}" if value >= 1 else f"{value:.4f} {currency}"


def budget_micros(budget: float) -> int:
    """A money budget from the config, in micros."""
    return round(budget * MICROS)
