"""Curation: operator pages, review forms and the live dashboard."""
