from django.apps import AppConfig


class ClawSiteConfig(AppConfig):
    name = "claw_site"

    def ready(self) -> None:
        # CLAW_TOKENIZER=demo: the demo upstream's toy tokenizer (claw_kit cannot import it).
        from claw_kit.llm.tokenizer import register_loader

        from .demo.hf_toy import HFToyTokenizer

        register_loader("demo", HFToyTokenizer)
        _admin_login_forbids_the_signed_in()


def _admin_login_forbids_the_signed_in() -> None:
    """A signed-in user without admin access (a reviewer) who opens /admin/ gets the site's
    403 page (templates/403.html: who they are, what role it needs, a way on), not Django's
    admin sign-in form asking them to sign in as someone else."""
    from django.contrib import admin
    from django.core.exceptions import PermissionDenied

    login = admin.site.login

    def staff_login(request, extra_context=None):  # type: ignore[no-untyped-def]
        if request.user.is_authenticated and not admin.site.has_permission(request):
            raise PermissionDenied("the admin needs the operator or admin role")
        return login(request, extra_context)

    admin.site.login = staff_login  # type: ignore[method-assign]
