"""``lite-push consume --from``: one line when it does not apply.

``--from first|last`` says where a group with no committed offset starts.
A group that has committed offsets on the topic resumes from them, so a
``--from`` given on purpose (a flag, ``LITE_PUSH_FROM`` or the config
file's ``from``; not the default) is ignored there: :func:`note_from` says
so once, at WARNING, and points to ``lite-push group reset-offsets``.
"""

from __future__ import annotations

import logging

from .plan import ConsumePlan
from .sources import Broker

__all__ = ["note_from"]

logger = logging.getLogger(__name__)


def note_from(plan: ConsumePlan, broker: Broker) -> None:
    """Log the notice when ``plan`` gave ``--from`` and its group has
    committed offsets on its topic (nothing for a ``^`` pattern, an unknown
    topic, or a source that cannot say: the command goes on either way)."""
    if not plan.from_given or plan.topic.startswith("^"):
        return
    group = plan.config.group
    try:
        queues = broker.queues(plan.topic)
        committed = broker.group_admin(group).committed(queues)
    except Exception as e:  # the consumer meets any real trouble itself
        logger.debug("--from: could not read the committed offsets of group %r: %s", group, e)
        return
    if committed:
        logger.warning(
            "--from %s applies to new groups only: group %r has committed offsets on %d of the %d queue(s) of "
            "topic %r and resumes from them; to move them, stop its members and run lite-push group "
            "reset-offsets --group %s --topic %s --to %s (add --execute)",
            plan.start,
            group,
            len(committed),
            len(queues),
            plan.topic,
            group,
            plan.topic,
            plan.start,
        )
