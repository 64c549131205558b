"""Who may touch the pool: a request proves it holds one of the pool's API keys (auth.py:
DRF authentication, the principal, scope permissions) and spends that key's rate budget
(throttling.py). Every door and page checks access here."""
