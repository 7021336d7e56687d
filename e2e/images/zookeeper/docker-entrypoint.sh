#!/bin/sh
# Writes /conf/zoo.cfg from the variables the official zookeeper image reads (the subset the
# chart sets: ZOO_MY_ID, ZOO_SERVERS, ZOO_4LW_COMMANDS_WHITELIST, ZOO_STANDALONE_ENABLED,
# ZOO_DATA_LOG_DIR, ZOO_MAX_CLIENT_CNXNS, ZOO_CFG_EXTRA: extra zoo.cfg lines separated by
# spaces), then runs the command.
set -eu
CONF=${ZOOCFGDIR:-/conf}
DATA=${ZOO_DATA_DIR:-/data}
# the official image's default (its ENV): the transaction log apart from the snapshots, as
# 0.1.0's chart (an emptyDir at /datalog) relies on; in the data directory, ZooKeeper refuses
# to start once a later chart moves the log (`Snapshot directory has log files`)
DATA_LOG=${ZOO_DATA_LOG_DIR:-/datalog}
mkdir -p "$CONF" "$DATA" "$DATA_LOG"
{
  echo "dataDir=$DATA"
  echo "dataLogDir=$DATA_LOG"
  echo "tickTime=${ZOO_TICK_TIME:-2000}"
  echo "initLimit=${ZOO_INIT_LIMIT:-5}"
  echo "syncLimit=${ZOO_SYNC_LIMIT:-2}"
  echo "autopurge.snapRetainCount=3"
  echo "autopurge.purgeInterval=24"
  echo "maxClientCnxns=${ZOO_MAX_CLIENT_CNXNS:-60}"
  echo "standaloneEnabled=${ZOO_STANDALONE_ENABLED:-true}"
  echo "admin.enableServer=false"
  echo "4lw.commands.whitelist=${ZOO_4LW_COMMANDS_WHITELIST:-srvr}"
  if [ -n "${ZOO_SERVERS:-}" ]; then
    for server in $ZOO_SERVERS; do echo "$server"; done
  else
    echo "clientPort=2181"
  fi
  for extra in ${ZOO_CFG_EXTRA:-}; do echo "$extra"; done
} > "$CONF/zoo.cfg"
echo "${ZOO_MY_ID:-1}" > "$DATA/myid"
exec "$@"
