"""The chat commands about the agent itself: ``/model``, ``/usage`` (``/skills`` is
gateway/commands/skills.py), and the model and profile lines of ``/status``. Their rows,
journaling and once-only replies are gateway/commands/builtin.py's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.untrusted import code_span
from gateway.intake import access, profiles

if TYPE_CHECKING:
    from channels.base import Inbound
    from gateway.commands.registry import CommandContext
    from gateway.config.schema import Config
    from gateway.store.usage import Totals

log = logging.getLogger(__name__)


def _model_label(config: Config, name: str) -> str:
    """``fast (gpt-4o-mini)``: the config's name and, when it differs, the provider's model id."""
    spec = next((m for m in config.models if m.name == name), None)
    provider = spec.kwargs().get("model") if spec is not None else None
    return f"{name} ({provider})" if isinstance(provider, str) and provider and provider != name else name


# -- /status -------------------------------------------------------------------------------------------
async def status_lines(ctx: CommandContext, inbound: Inbound) -> list[str]:
    """The model and profile lines of ``/status``."""
    now = await profiles.in_use(ctx.config, ctx.store, inbound)
    spec = next((m for m in ctx.config.models if m.name == now.model), None)
    provider = spec.kwargs().get("model") if spec is not None else None
    if not isinstance(provider, str) or not provider:
        provider = ctx.harness.model_name if now.model == ctx.config.agent.model else now.model
    model = f"Model: {provider}" + (f" ({now.model})" if provider != now.model else "")
    if now.chosen:
        model += f" — chosen with /model (default here: {now.default_model})"
    profile = f"Profile: {now.profile}" if now.profile else "Profile: none (the default agent)"
    if now.persona:
        profile += " — its own system prompt"
    return [model, profile]


def sandbox_line(state: str) -> str:
    """``Sandbox: ...`` for the ``state`` the agent's start-up probe found (not whether bubblewrap
    exists; :attr:`CommandContext.sandbox_state`). The probe's detail names host paths: /status is
    for the bot's users, so only the state and, when it failed, that the operator has the reason
    (``chital status``, the log)."""
    words = {
        "ready": "ready (commands run isolated)",
        "off": "off (agent.tools: false)",
        "failed": "NOT WORKING — I cannot run code or read files; the operator sees why in `chital status`",
        "unsandboxed": "UNSANDBOXED — commands run directly on the host (agent.sandbox.allow_unsandboxed)",
    }
    return f"Sandbox: {words.get(state, state)}"


# -- /model ----------------------------------------------------------------------------------------------
async def model_command(ctx: CommandContext, inbound: Inbound, args: str) -> str:
    """``/model`` lists the models; ``/model NAME`` switches this conversation's model."""
    config = ctx.config
    names = [m.name for m in config.models]
    now = await profiles.in_use(config, ctx.store, inbound)
    if not args:
        lines = ["Models (✓ = this conversation's):"]
        for name in names:
            mark = "✓" if name == now.model else "•"
            note = " — the default here" if name == now.default_model else ""
            lines.append(f"{mark} {_model_label(config, name)}{note}")
        if now.profile:
            lines.append(f"Profile: {now.profile}")
        lines.append("Switch with /model NAME." if len(names) > 1 else "Only one model is configured.")
        return "\n".join(lines)
    wanted = args.split()[0]
    if wanted not in names:
        shown = ", ".join(code_span(n) for n in names)
        return f"Unknown model {code_span(wanted)}. Models: {shown}. Send /model to see them."
    policy = config.access_for(inbound.platform)
    if (
        not inbound.is_direct
        and policy.group_model_switch == "admins"
        and not access.is_admin(policy, inbound)
    ):
        return "Only an admin of this bot can change the model of a group chat (everyone here uses it)."
    if wanted == now.model:
        return f"This conversation already uses {_model_label(config, wanted)}."
    choice = None if wanted == now.default_model else wanted
    await ctx.store.choose_model(inbound.conversation, choice, inbound.user)
    log.info("conversation %s: model %s chosen by %s", inbound.conversation, wanted, inbound.user)
    if choice is None:
        return f"↩️ Back to the default model here, {_model_label(config, wanted)}."
    return (
        f"🔀 This conversation now uses {_model_label(config, wanted)}; it goes on where it was. "
        f"/model {now.default_model} switches back."
    )


# -- /usage ----------------------------------------------------------------------------------------------
def _row(totals: Totals, currency: str | None = None) -> str:
    """One line of tokens, with their cost when prices are configured (``currency``)."""
    row = f"{totals.name}: {totals.today:,} · {totals.week:,} · {totals.month:,}"
    row = f"{row} (≈ {totals.estimated:,} estimated)" if totals.estimated else row
    return row if currency is None else f"{row} — {_cost(totals, currency)}"


def _cost(totals: Totals, currency: str) -> str:
    """``cost 0.0123 USD · …``; ``cost unknown`` when none of the tokens had a price (never 0),
    ``cost ≥ …`` with the unpriced tokens named when only some had."""
    from gateway.turns.pricing import money

    unpriced = totals.unpriced[2]
    if unpriced and not any(totals.cost):
        return "cost unknown (no price for this model)" if unpriced == totals.month else "cost unknown"
    sign = "≥ " if unpriced else ""
    shown = " · ".join(sign + money(c, currency) for c in totals.cost)
    return f"cost {shown} (unknown for {unpriced:,} tokens)" if unpriced else f"cost {shown}"


def _sum(rows: list[Totals], name: str) -> Totals:
    from gateway.store.usage import Totals

    def window(values: list[tuple[int, int, int]]) -> tuple[int, int, int]:
        return (sum(v[0] for v in values), sum(v[1] for v in values), sum(v[2] for v in values))

    return Totals(
        name, sum(r.today for r in rows), sum(r.week for r in rows), sum(r.month for r in rows),
        sum(r.estimated for r in rows), window([r.cost for r in rows]), window([r.unpriced for r in rows]),
    )  # fmt: skip


ESTIMATED_NOTE = (
    "≈ estimated: the model service reported no token counts for some calls, so they were counted "
    "by estimate (about 4 bytes of text a token; an image 1,000)."
)


async def usage_command(ctx: CommandContext, inbound: Inbound) -> str:
    """A user's own tokens per model (today, 7 and 30 days) and their budget; an admin in a direct
    message also sees everyone's totals per model and the top users."""
    from gateway.turns.pricing import money
    from gateway.turns.usage import TOP_USERS, budget_of, money_budget_of

    config, store = ctx.config, ctx.store
    currency = config.usage.currency if config.usage.prices else None  # no prices: tokens only
    today = config.usage.today()
    policy = config.access_for(inbound.platform)
    admin = access.is_admin(policy, inbound)
    mine = await store.usage_totals(today, "model", user=inbound.user)
    lines: list[str] = []
    if mine:
        lines.append("Your tokens (prompt + completion) — today · 7 days · 30 days")
        lines += [_row(r, currency) for r in mine]
        if len(mine) > 1:
            lines.append(_row(_sum(mine, "Total"), currency))
    else:
        lines.append("You have used no tokens in the last 30 days.")
    if any(r.estimated for r in mine):
        lines.append(ESTIMATED_NOTE)
    budget = budget_of(config, inbound.user, admin)
    if budget:
        used = sum(r.today for r in mine)
        left = max(0, budget - used)
        lines.append(
            f"Daily budget: {used:,} of {budget:,} tokens used today, {left:,} left "
            f"(renews at midnight, {config.usage.timezone})."
        )
    limit = money_budget_of(config, inbound.user, admin)
    if limit:
        cost = sum(r.cost[0] for r in mine)
        unit = config.usage.currency
        lines.append(
            f"Daily money budget: {money(cost, unit)} of {money(limit, unit)} spent today, "
            f"{money(max(0, limit - cost), unit)} left (renews at midnight, {config.usage.timezone})."
        )
    if admin and inbound.is_direct:
        models = await store.usage_totals(today, "model")
        users = await store.usage_totals(today, "user", limit=TOP_USERS)
        lines += ["", "Everyone — today · 7 days · 30 days"]
        if not models:
            lines.append("No tokens used in the last 30 days.")
        else:
            lines += [_row(r, currency) for r in models]
            lines.append(_row(_sum(models, "Total"), currency))
            lines += ["", f"Top users (30 days, first {TOP_USERS}):"]
            lines += [_row(r, currency) for r in users]
            if any(r.estimated for r in models) and not any(r.estimated for r in mine):
                lines.append(ESTIMATED_NOTE)
    elif admin:
        lines.append("(Everyone's usage: send me /usage in a direct message.)")
    return "\n".join(lines)
