"""The whole server: app.py's OpenAI-compatible application plus llama-server's native endpoints.

The native endpoints live in modules of their own that build on app.py (native.py: /completion,
/infill, /props, /apply-template; slot_actions.py: /slots/{id}?action=...; embeddings_route.py:
/v1/embeddings, /embedding(s)); this module joins them, so that app.py never imports them back.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Route

from . import app as base
from . import embeddings_route, native, slot_actions


def create_app(state: base.ServerState) -> Starlette:
    """app.create_app's application with the native routes added (behind the same API-key check and error
    handling). As in llama-server, /completions is the native /completion, /v1/completions OpenAI's."""
    application = base.create_app(state)

    def route(path: str, handler: base.Handler, method: str) -> Route:
        return Route(path, base._guarded(state, handler, public=path in base.PUBLIC_PATHS), methods=[method])

    application.router.routes.extend([
        route("/completion", native.completion, "POST"), route("/completions", native.completion, "POST"),
        route("/infill", native.infill, "POST"), route("/props", native.props, "GET"),
        route("/props", native.post_props, "POST"), route("/apply-template", native.apply_template, "POST"),
        route("/slots/{id_slot}", slot_actions.slot_action, "POST"),
        route("/v1/embeddings", embeddings_route.embeddings_oai, "POST"),
        route("/embedding", embeddings_route.embeddings_native, "POST"),
        route("/embeddings", embeddings_route.embeddings_native, "POST"),
    ])
    return application
