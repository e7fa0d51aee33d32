"""What the routes of one app read: the front, the settings, each dialect's parser, the Batch service.

`create_app` puts one `ApiContext` in the app's state; the route handlers are module-level functions that find it
there (`api_context(request)`), so the factories that register them only document and route them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from basal.api.decide import Parse
from basal.api.settings import ApiSettings
from basal.batch.service import BatchService
from basal.core.engine.front import EnginesFront
from basal.core.engine.shadow import ShadowFront

if TYPE_CHECKING:
    from litestar.connection import ASGIConnection


@dataclass(frozen=True)
class ApiContext:
    engines: EnginesFront
    settings: ApiSettings
    parsers: dict[str, Parse]  # "systemone", "basal" -> that dialect's parser (`decide.parsers`)
    batches: BatchService | None = None  # the Files and Batches API's store and runner, when served
    shadow: ShadowFront | None = None  # the front that shadows models (GET /v1/shadow), when one does

    @property
    def keyed_service(self) -> bool:
        """/metrics and /schema ask for the key too (keys are set, and not made public for them)."""
        return bool(self.settings.api_keys) and not self.settings.public_metrics_and_schema


def api_context(connection: ASGIConnection) -> ApiContext:
    return connection.app.state["api"]  # an item, not `state.api`: that attribute is found only after a miss (~5x)
