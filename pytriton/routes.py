"""The request and response of a custom route (`Triton.add_route`); see docs/composition.md.

Examples:
    from pytriton.compose import call_model_async
    from pytriton.routes import RouteRequest, RouteResponse

    async def classify(request: RouteRequest) -> RouteResponse:
        outputs = await call_model_async("classifier", {"x": np.array(request.json()["x"], np.float32)})
        return RouteResponse.json({"label": outputs["label"]})

    triton.add_route("/classify", classify, methods=["POST"])
"""

from __future__ import annotations

from pytriton.transport.http.custom import RouteRequest, RouteResponse

__all__ = ["RouteRequest", "RouteResponse"]
