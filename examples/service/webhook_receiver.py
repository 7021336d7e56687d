"""A webhook receiver for a delayq `webhook` topic that checks the signature.

    SECRET=whsec_$(head -c 32 /dev/urandom | base64)
    DELAYQ_SECRET=$SECRET python3 examples/service/webhook_receiver.py  # listens on :9000
    delayq serve --topic-type webhook --webhook-url http://127.0.0.1:9000/hook \
                 --webhook-secret "$SECRET"

Deliveries are signed the Standard Webhooks way (webhook-id, webhook-timestamp,
webhook-signature), so the `standardwebhooks` package (pip install standardwebhooks) checks
them: its `verify` refuses a wrong signature and a timestamp more than five minutes off.

Answer 2xx only once the message is safely handled: anything else (or no answer within the
topic's webhook timeout) makes delayq retry with exponential backoff, and after maxRetries the
message goes dead (to the topic's dead letters, `GET .../dead`). Deliveries are at least once:
dedupe by `id` (+ `attempt`).
"""

from __future__ import annotations

import os
import time

from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

WEBHOOK = Webhook(os.environ["DELAYQ_SECRET"])


async def hook(request: web.Request) -> web.Response:
    body = await request.read()  # verify the exact bytes, before any JSON parsing
    try:
        message = WEBHOOK.verify(body, dict(request.headers))
    except WebhookVerificationError:
        return web.Response(status=401, text="bad signature")
    lateness_ms = int(time.time() * 1000) - message["dueMs"]
    print(f"{message['id']} attempt {message['attempt']} late {lateness_ms} ms")
    return web.Response(status=204)


if __name__ == "__main__":
    app = web.Application()
    app.router.add_post("/hook", hook)
    web.run_app(app, host="127.0.0.1", port=int(os.environ.get("PORT", "9000")))
