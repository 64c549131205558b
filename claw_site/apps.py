from django.apps import AppConfig


class ClawSiteConfig(AppConfig):
    name = "claw_site"

    def ready(self) -> None:
        # CLAW_TOKENIZER=demo: the demo upstream's toy tokenizer (claw_kit cannot import it).
        from claw_kit.llm.tokenizer import register_loader

        from .demo.hf_toy import HFToyTokenizer

        register_loader("demo", HFToyTokenizer)
