#!/bin/sh
# `zkServer.sh start-foreground`, as the official image's command runs it: the server in the
# foreground on /conf/zoo.cfg, logging to stdout; the heap from ZK_SERVER_HEAP (MiB), as the
# official image's zkEnv.sh reads it.
set -eu
[ "${1:-}" = start-foreground ] || { echo "zkServer.sh: only start-foreground is supported" >&2; exit 2; }
CONF=${ZOOCFGDIR:-/conf}
exec java -Xmx${ZK_SERVER_HEAP:-1000}m -Dorg.slf4j.simpleLogger.showDateTime=true \
  -cp "$CONF:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar" \
  org.apache.zookeeper.server.quorum.QuorumPeerMain "$CONF/zoo.cfg"
