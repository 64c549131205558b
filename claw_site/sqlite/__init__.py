"""Django's SQLite backend, creating the database file's folder on first connection (so that
importing the settings creates nothing on disk)."""
