"""OpenAI-compatible endpoint for topology extraction. Unset base URL -> the offline extractor.

Configure with environment variables (or resource config in the Launchpad):
``ENVSCHED_LLM_BASE_URL``, ``ENVSCHED_LLM_MODEL``, ``ENVSCHED_LLM_API_KEY``.
"""

import os

import dagster as dg
from pydantic import Field

from envsched_pipeline.graph.llm import LLMTopologyExtractor


class LLMResource(dg.ConfigurableResource):
    base_url: str = Field(
        default="",
        description="OpenAI-compatible base URL; empty: $ENVSCHED_LLM_BASE_URL, "
        "and when that is unset the offline extractor is used.",
    )
    model: str = Field(default="", description="Model name; empty: $ENVSCHED_LLM_MODEL (default qwen3-8b).")
    api_key: str = Field(default="", description="API key; empty: $ENVSCHED_LLM_API_KEY.")
    concurrency: int = Field(default=4, description="Requests in flight at once.")
    max_attempts: int = Field(default=5, description="Attempts per task before the offline fallback.")
    timeout_s: float = Field(default=30.0, description="Per-request timeout in seconds.")

    def _base_url(self) -> str:
        return self.base_url or os.environ.get("ENVSCHED_LLM_BASE_URL", "")

    def enabled(self) -> bool:
        return bool(self._base_url())

    def extractor(self, lake):

        model = self.model or os.environ.get("ENVSCHED_LLM_MODEL", "qwen3-8b")
        return LLMTopologyExtractor(
            base_url=self._base_url(),
            model=model,
            api_key=self.api_key or os.environ.get("ENVSCHED_LLM_API_KEY", "none"),
            cache_dir=lake.local / "llm_cache",
            concurrency=self.concurrency,
            max_attempts=self.max_attempts,
            timeout=self.timeout_s,
        )
