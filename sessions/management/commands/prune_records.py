"""``manage.py prune_records``: delete operator records older than the retention.

Deletes :class:`~sessions.models.SubscriberConnection` rows closed more than
``--days`` days ago (default: the ``RECORDS_RETENTION_DAYS`` setting, 30) with their
incidents, and incidents older than that whose connection is kept (a long-lived
connection's old warnings). Rows never closed (still streaming, or left open by a process
that died) are kept unless ``--include-unclosed`` is given, which also deletes those
opened before the cutoff. ``--dry-run`` only counts. Prints one line:
``connections=N incidents=M cutoff=<ISO time>``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management import BaseCommand, CommandError
from django.core.management.base import CommandParser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from sessions.conf import get_config
from sessions.models import SubscriberConnection, SubscriberIncident


class Command(BaseCommand):
    help = "Delete subscriber connection and incident records older than the retention."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="keep this many days (default: RECORDS_RETENTION_DAYS, 30)",
        )
        parser.add_argument(
            "--include-unclosed",
            action="store_true",
            help="also delete connections never closed and opened before the cutoff",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        days = (
            options["days"] if options["days"] is not None else get_config().records_retention_days
        )
        if days < 1:
            raise CommandError(f"--days must be at least 1, got {days}")
        cutoff = timezone.now() - timedelta(days=days)
        old = Q(closed_at__lt=cutoff)
        if options["include_unclosed"]:
            old |= Q(closed_at__isnull=True, opened_at__lt=cutoff)
        connections = SubscriberConnection.objects.filter(old)
        incidents = SubscriberIncident.objects.filter(
            Q(at__lt=cutoff) | Q(connection__in=connections)
        )
        with transaction.atomic():
            counts = (connections.count(), incidents.count())
            if not options["dry_run"]:
                incidents.delete()
                connections.delete()
        prefix = "would delete " if options["dry_run"] else ""
        self.stdout.write(
            f"{prefix}connections={counts[0]} incidents={counts[1]} cutoff={cutoff.isoformat()}"
        )
