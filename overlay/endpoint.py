"""The ``vllm.endpoint_plugins`` entry point: the ring's fault, named on /health and on every request.

When a ring peer dies, this node's worker writes the fault record and stops (overlay/fault.py);
vLLM then marks its engine dead and answers 503 on ``/health`` and "EngineCore encountered an
issue" on requests. This plugin puts the cause in those answers, from the record: ``/health``
answers 503 with ``{"error": {"message": "rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) stopped
answering at ..."}}`` as soon as the record exists (before vLLM has noticed); every other
request, a 5xx answer made meanwhile, and a request still waiting on the engine when the record
appears (vLLM can leave one waiting on an engine that is gone) get the same message with 503.
It only adds HTTP surface (a route and a middleware), as the endpoint-plugin contract asks;
vLLM loads it only when ``VLLM_PLUGINS`` names it (``sparkring_overlay,sparkring_fault``).
"""

import asyncio
import json
from argparse import Namespace
from typing import Any

from overlay.fault import read_fault

UNTOUCHED = ("/metrics",)  # what was counted must stay readable after a fault
FAULT_POLL_S = 0.25  # how often a request waiting on the engine looks for the fault record


def fault_body(record: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style error naming the dead rank and the cable."""
    message = f"the ring failed: {record.get('message', 'a ring peer stopped answering')}"
    return {"error": {"message": message, "type": "ServiceUnavailableError", "param": None, "code": 503}}


async def send_fault(record: dict[str, Any], send: Any) -> None:
    """The fault's 503, as ASGI messages."""
    body = json.dumps(fault_body(record)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class FaultMiddleware:
    """Plain ASGI (not a decorated function), so that a request it answers for the fault ends
    then, whatever vLLM's handler still waits on, and an answer already started stays the app's."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in UNTOUCHED or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        record = read_fault()
        if record is not None:
            await send_fault(record, send)
            return
        started = replaced = False

        async def answer(message: dict[str, Any]) -> None:
            nonlocal started, replaced
            if replaced:
                return  # this request was answered for the fault: what vLLM says later goes nowhere
            if message["type"] == "http.response.start":
                started = True
                found = read_fault() if message["status"] >= 500 else None
                if found is not None:
                    replaced = True
                    await send_fault(found, send)
                    return
            await send(message)

        app = asyncio.ensure_future(self.app(scope, receive, answer))
        while not (await asyncio.wait({app}, timeout=FAULT_POLL_S))[0]:
            record = None if started else read_fault()
            if record is not None:
                replaced = True
                await send_fault(record, send)
                # vLLM's handler is left to end as the engine's death reaches it, unawaited, so
                # this request ends now and vLLM's shutdown waits for nothing. (With the handler
                # cancelled instead, rank 0 stayed up after the fault in the sim's test.)
                app.add_done_callback(lambda done: done.cancelled() or done.exception())
                return
        app.result()  # the app's own error, raised as it would be without this middleware


class FaultEndpoint:
    """Replaces ``/health`` and adds a middleware; no engine access beyond its health check."""

    name = "sparkring_fault"
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi import Request
        from fastapi.responses import JSONResponse, Response
        from vllm.v1.engine.exceptions import EngineDeadError

        @app.get("/health", response_class=Response)
        async def health(raw_request: Request) -> Response:
            record = read_fault()
            if record is not None:
                return JSONResponse(fault_body(record), status_code=503)
            client = raw_request.app.state.engine_client
            if client is None:
                return Response(status_code=200)
            try:
                await client.check_health()
            except EngineDeadError:
                return Response(status_code=503)
            return Response(status_code=200)

        app.add_middleware(FaultMiddleware)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        return None
