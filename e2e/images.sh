#!/usr/bin/env bash
# Build the container images of the real-pods tier locally: no registry is reachable here.
#   base       debootstrap --variant=minbase of Debian bookworm, imported with `podman import`
#   python     base + Debian's python3 (the stand-in for python:3.11.16-slim-bookworm)
#   delayq     the project's Dockerfile with --build-arg BASE=<python>
#   pipeline   examples/pipeline/Dockerfile with --build-arg BASE=<python> (Java, PySpark)
#   redis      base + Debian's redis-server, laid out as the official redis image
#   zookeeper  base + Debian's ZooKeeper jars and a ZOO_*-compatible entrypoint
#   coredns    FROM scratch + the CoreDNS binary e2e/build.sh compiled
#   pause      FROM scratch + Debian's static catatonit (containerd's sandbox image)
#   delayq-previous  the previous release of releases.yaml (its commit's operator/ tree, `git
#              archive`) installed over the delayq image: e2e/images/release, test_upgrade.py
# Every tag is a hash of what goes into the image (never `latest`), and each image is saved as a
# docker-archive under the cache, so a warm run only hashes inputs. The node harness imports the
# archives into its containerd. Beside each archive: the image's ID (sha256 of its config, the
# content it runs), and for delayq the SBOM (CycloneDX JSON) copied out of the image. Usage:
# e2e/images.sh <e2e bin dir>. Prints one line of JSON, {name: {"image": ref, "archive": path,
# "id": "sha256:...", ["sbom": path]}}, as its last line; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN_DIR=${1:?usage: e2e/images.sh <bin dir from e2e/build.sh>}
CACHE="${DELAYQ_E2E_CACHE:-$HOME/.cache/delayq-e2e}/images"
SUITE=bookworm
MIRROR="${DELAYQ_E2E_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REV=1  # bump when the recipe below changes in a way the hashed inputs do not show
mkdir -p "$CACHE/archives"

log() { echo "e2e/images: [$(date -u +%H:%M:%S)] $*" >&2; }
hash_of() { sha256sum | cut -c1-12; }
files_hash() {  # content hash of files and directories (sorted paths, __pycache__ left out)
  find "$@" -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | hash_of
}
dir_hash() { (cd "$1" && files_hash .); }  # paths relative to the directory: a staged copy hashes alike

for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { log "$tool not found (scripts/setup.sh installs it)"; exit 1; }
done

# --- base: debootstrap once, then `podman import` (both cached) ------------------------------------
BASE_TAG="$SUITE-$(echo "$SUITE minbase $REV" | hash_of)"
BASE="localhost/delayq-e2e/base:$BASE_TAG"
if ! podman image exists "$BASE"; then
  start=$SECONDS
  rootfs="$CACHE/rootfs-$BASE_TAG"
  if [ ! -f "$rootfs.done" ]; then
    rm -rf "$rootfs"
    log "debootstrap --variant=minbase $SUITE (about 1.5 min) ..."
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    touch "$rootfs.done"
  fi
  tar -C "$rootfs" -c . | podman import -q - "$BASE" >/dev/null
  log "base image $BASE took $((SECONDS - start))s"
fi

declare -A REF ARCHIVE SBOM

image_id() {  # image_id <archive>: the image's ID (the sha256 of its config), kept beside it
  local archive=$1
  if [ ! -f "$archive.id" ]; then
    tar -xOf "$archive" manifest.json | python3 -c 'import json, sys
config = json.load(sys.stdin)[0]["Config"]  # "<hex>.json" (docker-archive)
print("sha256:" + config.rsplit("/", 1)[-1].removesuffix(".json"))' >"$archive.id.tmp"
    mv "$archive.id.tmp" "$archive.id"
  fi
  cat "$archive.id"
}

build() {  # build <name> <tag> <context dir> [podman build args...]
  local name=$1 tag=$2 context=$3; shift 3
  local ref="localhost/delayq-e2e/$name:$tag"
  local archive="$CACHE/archives/$name-$tag.tar"
  REF[$name]=$ref; ARCHIVE[$name]=$archive
  [ -f "$archive" ] && return 0
  local start=$SECONDS
  log "build $ref ..."
  podman build -q --network=host -t "$ref" "$@" "$context" >/dev/null
  podman save -q -o "$archive.tmp" "$ref"
  mv "$archive.tmp" "$archive"
  # earlier tags of this image: their archives (and files beside them) and images are replaced
  # (not a .tmp another run is still writing)
  find "$CACHE/archives" -name "$name-*" -not -name "$name-$tag.*" -not -name '*.tmp' -delete
  podman images --format '{{.Repository}}:{{.Tag}}' | grep "^localhost/delayq-e2e/$name:" \
    | grep -v ":$tag\$" | xargs -r podman rmi -f >/dev/null 2>&1 || true
  log "$ref took $((SECONDS - start))s ($(du -h "$archive" | cut -f1) archive)"
}

images="$ROOT/e2e/images"
# The build context is a copy of exactly the inputs hashed (no caches, no .git).
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
stage() {  # stage <name> <files...>: a context dir with the image's Dockerfile and these files
  local staged="$context/$1"; shift
  mkdir -p "$staged"
  cp -r "$@" "$staged/"
  echo "$staged"
}

# python also carries this machine's CA bundle, and pip is told to use it: package downloads may
# pass through a TLS-intercepting proxy (as here). Only e2e images have it.
staged=$(stage python "$images/python/Dockerfile" /etc/ssl/certs/ca-certificates.crt)
build python "$( (echo "$BASE"; dir_hash "$staged") | hash_of)" "$staged" --build-arg "BASE=$BASE"
for name in redis zookeeper; do
  build "$name" "$( (echo "$BASE"; dir_hash "$images/$name") | hash_of)" "$images/$name" \
    --build-arg "BASE=$BASE"
done

version=$(python3 -c 'import re,sys; print(re.search(r"__version__ = \"(.+?)\"", open(sys.argv[1]).read())[1])' \
  "$ROOT/operator/delayq/__init__.py")
delayq_inputs=(Dockerfile pyproject.toml README.md LICENSE requirements operator)
delayq_hash=$( (echo "${REF[python]}"; files_hash "${delayq_inputs[@]}") | hash_of)
mkdir -p "$context/delayq"
tar -c --exclude=__pycache__ "${delayq_inputs[@]}" | tar -C "$context/delayq" -x
build delayq "$version-$delayq_hash" "$context/delayq" --build-arg "BASE=${REF[python]}"
# The SBOM the Dockerfile wrote into the image (CycloneDX JSON), kept beside its archive.
SBOM[delayq]="${ARCHIVE[delayq]%.tar}.sbom.cdx.json"
if [ ! -f "${SBOM[delayq]}" ]; then
  podman image exists "${REF[delayq]}" || podman load -q -i "${ARCHIVE[delayq]}" >/dev/null
  container=$(podman create "${REF[delayq]}")
  podman cp "$container:/usr/share/doc/delayq/sbom.cdx.json" "${SBOM[delayq]}.tmp"
  podman rm -f "$container" >/dev/null
  mv "${SBOM[delayq]}.tmp" "${SBOM[delayq]}"
fi

# The pipeline image (examples/pipeline/Dockerfile: Debian's Java 17 and the hashed pipeline
# lock, PySpark included) on the python image: the DR drill runs a topic's scheduled backup as a
# Job of it on the real node. About 4 min and 1.5 GB cold (Java 350 MB, the lock 880 MB); a
# change of operator/ only rebuilds its last layers (podman's layer cache) and saves it again.
pipeline_inputs=(examples/pipeline/Dockerfile examples/pipeline/submit.py pyproject.toml README.md
  LICENSE requirements operator)
pipeline_hash=$( (echo "${REF[python]}"; files_hash "${pipeline_inputs[@]}") | hash_of)
mkdir -p "$context/pipeline"
tar -c --exclude=__pycache__ "${pipeline_inputs[@]}" | tar -C "$context/pipeline" -x
build pipeline "$version-$pipeline_hash" "$context/pipeline" \
  -f "$context/pipeline/examples/pipeline/Dockerfile" --build-arg "BASE=${REF[python]}"

# The previous release (releases.yaml) for the upgrade test: its operator/ tree, `git archive`d
# from its recorded commit, installed over the delayq image above (e2e/images/release). The
# commit names its content, so its tag only changes with the image it is built on.
read -r previous_version previous_commit < <(python3 "$ROOT/e2e/harness/releases.py" previous)
mkdir -p "$context/previous"
cp "$images/release/Dockerfile" "$context/previous/"
git -C "$ROOT" archive "$previous_commit" pyproject.toml README.md operator \
  | tar -C "$context/previous" -x
build delayq-previous \
  "$previous_version-$( (echo "${REF[delayq]}"; echo "$previous_commit"; dir_hash "$images/release") \
  | hash_of)" "$context/previous" --build-arg "BASE=${REF[delayq]}"

staged=$(stage coredns "$images/coredns/Dockerfile" "$BIN_DIR/coredns")
build coredns "$(dir_hash "$staged")" "$staged"
staged=$(stage pause "$images/pause/Dockerfile" /usr/bin/catatonit)
build pause "$(dir_hash "$staged")" "$staged"

line="{"
for name in "${!REF[@]}"; do
  line+="\"$name\": {\"image\": \"${REF[$name]}\", \"archive\": \"${ARCHIVE[$name]}\""
  line+=", \"id\": \"$(image_id "${ARCHIVE[$name]}")\""
  [ -z "${SBOM[$name]:-}" ] || line+=", \"sbom\": \"${SBOM[$name]}\""
  line+="}, "
done
echo "${line%, }}"
