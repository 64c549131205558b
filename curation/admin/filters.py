"""List filters for the curation signals of steps: readiness and quality bits, labels, tags
and feedback.

Bit tests are written so the database can use what it has: readiness as an IN list of the
values that hold (or lack) a bit (16 values at most; "ready" hits the step_ready partial
index), quality as ``quality_flags & bit = bit`` (an alias, never selected). Tags and feedback
are EXISTS subqueries, so a filter adds no join and no duplicate rows.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from pool.flags import QUALITY_NAMES, READINESS_NAMES, READY, READY_ANY_TOKENS
from pool.models import Feedback, Step

from ..models import StepTag

# Every value a readiness column can hold (4 bits).
_READINESS_VALUES = range(READY + 1)
# Tags offered by the tag filter: the most a filter sidebar can usefully list.
MAX_TAG_CHOICES = 100


class ReadinessFilter(admin.SimpleListFilter):
    title = "readiness"
    parameter_name = "readiness"

    def lookups(self, request, model_admin):
        return [
            ("ready", "ready"),
            ("ready_any_tokens", "ready if retokenized allowed"),
            ("not_ready", "not ready"),
            *((f"missing_{name}", f"missing {name.replace('_', ' ')}") for name in READINESS_NAMES),
        ]

    def queryset(self, request, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if value == "ready":
            return queryset.filter(readiness=READY)
        if value == "ready_any_tokens":
            return queryset.filter(readiness__in=[READY, READY_ANY_TOKENS])
        if value == "not_ready":
            return queryset.exclude(readiness=READY)
        if value and value.startswith("missing_") and value[8:] in READINESS_NAMES:
            bit = READINESS_NAMES[value[8:]]
            return queryset.filter(readiness__in=[v for v in _READINESS_VALUES if not v & bit])
        return None


class QualityFilter(admin.SimpleListFilter):
    title = "quality"
    parameter_name = "quality"

    def lookups(self, request, model_admin):
        return [
            ("clean", "clean (no flag)"),
            *((name, f"has {name.replace('_', ' ')}") for name in QUALITY_NAMES),
        ]

    def queryset(self, request, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if value == "clean":
            return queryset.filter(quality_flags=0)
        if value in QUALITY_NAMES:
            bit = int(QUALITY_NAMES[value])
            return queryset.alias(_quality_bit=F("quality_flags").bitand(bit)).filter(_quality_bit=bit)
        return None


class LabelFilter(admin.SimpleListFilter):
    title = "label"
    parameter_name = "label"

    def lookups(self, request, model_admin):
        return [("none", "unlabelled"), *((v, v) for v in Step.Label.values if v)]

    def queryset(self, request, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if value == "none":
            return queryset.filter(label="")
        if value in Step.Label.values:
            return queryset.filter(label=value)
        return None


class TagFilter(admin.SimpleListFilter):
    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        tags = StepTag.objects.values_list("tag", flat=True).distinct().order_by("tag")[:MAX_TAG_CHOICES]
        return [("__none__", "untagged"), *((t, t) for t in tags)]

    def queryset(self, request, queryset: QuerySet) -> QuerySet | None:

        value = self.value()
        if value == "__none__":
            return queryset.filter(~Exists(StepTag.objects.filter(step_id=OuterRef("pk"))))
        if value:
            return queryset.filter(Exists(StepTag.objects.filter(step_id=OuterRef("pk"), tag=value)))
        return None


class FeedbackFilter(admin.SimpleListFilter):
    """Feedback given on the step itself or on its trajectory."""

    title = "feedback"
    parameter_name = "feedback"

    def lookups(self, request, model_admin):
        return [("with", "has feedback"), ("without", "no feedback")]

    def queryset(self, request, queryset: QuerySet) -> QuerySet | None:
        about = Exists(
            Feedback.objects.filter(Q(step_id=OuterRef("pk")) | Q(trajectory_id=OuterRef("trajectory_id")))
        )
        if self.value() == "with":
            return queryset.filter(about)
        if self.value() == "without":
            return queryset.filter(~about)
        return None


class GroupReadyFilter(admin.SimpleListFilter):
    title = "ready"
    parameter_name = "ready"

    def lookups(self, request, model_admin):
        return [("yes", "ready"), ("no", "not ready")]

    def queryset(self, request, queryset: QuerySet) -> QuerySet | None:
        if self.value() == "yes":
            return queryset.filter(ready_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(ready_at__isnull=True)
        return None
