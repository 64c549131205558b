"""REST API v1 for white-box agents, services and readers, one module per resource (gateway/urls.py
routes each path to its view).

Views are adapters: parse and validate input, call one pool service or selector, render.
"""
