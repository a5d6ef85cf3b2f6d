"""Channels a platform allows once per bot (Telegram's long poll, Discord's gateway session, Matrix's
sync) run their receiving side on the cluster's leader only (docs/scale-out.md).

Apart from the Daemon so that the one rule is readable on its own: which supervisors are leader-only,
what a standby runs, and what a leadership change does to them. A send-only channel switches to
receiving and back without closing (:meth:`ChannelSupervisor.switch`), so an answer being sent at
that moment goes on; the others are started and stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.config.platforms import PLATFORMS
from gateway.daemon.cluster import Cluster
from gateway.ops.supervisor import ChannelSupervisor


def standby_leader_only(
    supervisors: Iterable[ChannelSupervisor], standby: set[ChannelSupervisor], cluster: Cluster
) -> None:
    """Put the leader-only channels in ``standby`` (send-only ones started for sending) and hook
    their switch to the cluster's leadership changes. ``standby`` is the Daemon's set, read by its
    channel report."""
    single = {p.name for p in PLATFORMS if p.single_consumer}
    leader_only = [s for s in supervisors if s.channel.name in single]
    standby.update(leader_only)
    for sup in leader_only:
        if sup.channel.can_send_only:  # connected for sending: this daemon still delivers
            sup.channel.receive = False
            sup.start()

    async def lead() -> None:
        for sup in leader_only:
            if sup in standby:
                standby.discard(sup)
                if sup.channel.can_send_only:
                    await sup.switch(receive=True)
                else:
                    sup.channel.receive = True
                    sup.start()

    async def unlead() -> None:
        for sup in leader_only:
            if sup not in standby:
                standby.add(sup)
                if sup.channel.can_send_only:
                    await sup.switch(receive=False)
                else:
                    await sup.stop()

    cluster.on_lead.append(lead)
    cluster.on_unlead.append(unlead)
