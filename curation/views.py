"""Operator pages."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from pool.selectors import pool_stats


@login_required
def home(request):
    return render(request, "curation/home.html", {"stats": pool_stats()})
