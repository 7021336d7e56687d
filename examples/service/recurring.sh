#!/usr/bin/env bash
# Recurring schedules through the HTTP API of `delayq serve`: a weekday report in Berlin time,
# a heartbeat every minute, then list, read and delete them (docs/service.md, "Recurring
# schedules"). Each occurrence arrives like any message, with the id <schedule id>@<due ms>.
set -euo pipefail
URL=${DELAYQ_URL:-http://127.0.0.1:8080}/v1/topics/${DELAYQ_TOPIC:-orders}
AUTH="Authorization: Bearer ${DELAYQ_TOKEN:-}"

curl -sS -H "$AUTH" -X PUT "$URL/schedules/daily-report" \
  -d '{"cron": "0 9 * * 1-5", "timeZone": "Europe/Berlin", "payload": "{\"report\": \"daily\"}",
       "catchUp": "skip"}'
echo
curl -sS -H "$AUTH" -X PUT "$URL/schedules/heartbeat" -d '{"everyMs": 60000, "catchUp": "once"}'
echo
curl -sS -H "$AUTH" "$URL/schedules"; echo
curl -sS -H "$AUTH" "$URL/schedules/heartbeat"; echo
curl -sS -H "$AUTH" -X DELETE "$URL/schedules/heartbeat"; echo
curl -sS -H "$AUTH" -X DELETE "$URL/schedules/daily-report"; echo
