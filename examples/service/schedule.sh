#!/usr/bin/env bash
# Schedule, inspect, reschedule and cancel a message through the HTTP API of `delayq serve`.
set -euo pipefail
URL=${DELAYQ_URL:-http://127.0.0.1:8080}/v1/topics/${DELAYQ_TOPIC:-orders}
AUTH="Authorization: Bearer ${DELAYQ_TOKEN:-}"

curl -sS -H "$AUTH" -X POST "$URL/messages" \
  -d '{"id": "order-42-timeout", "delayMs": 60000, "payload": "{\"order\": 42}"}'
echo
curl -sS -H "$AUTH" "$URL/messages/order-42-timeout"; echo
curl -sS -H "$AUTH" -X POST "$URL/messages/order-42-timeout/reschedule" -d '{"delayMs": 5000}'
echo
curl -sS -H "$AUTH" -X DELETE "$URL/messages/order-42-timeout"; echo
curl -sS -H "$AUTH" "$URL/stats"; echo
