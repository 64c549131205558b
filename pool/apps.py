from django.apps import AppConfig


class PoolConfig(AppConfig):
    name = "pool"
    verbose_name = "Data pool"
    default_auto_field = "django.db.models.BigAutoField"
