"""The HTTP/REST frontend: routes, the fast path on uvicorn's protocol, body limits, admin and
generate routers, parser processes."""
