#!/usr/bin/env bash
# Install the jars Spark needs for s3a:// paths (`delayq pipeline backup --output s3a://...`) into
# a per-user cache (idempotent) and print them comma-separated, as `spark.jars` takes them.
#
# hadoop-aws matches the hadoop-client jars pyspark carries (3.5.0). Its declared dependency, the
# AWS SDK v2 `bundle`, is 686 MB; S3A needs only the S3 client, its transfer manager and what
# they depend on: the 35 jars below (18 MB), the set Ivy resolves for hadoop-aws, s3 and
# s3-transfer-manager with the bundle excluded, less what pyspark's own jars already hold (netty,
# httpclient, commons-codec, commons-logging, slf4j). Each is fetched from Maven Central and
# checked against its pinned SHA-256 (taken from the files whose SHA-1 matched Central's).
set -euo pipefail
S3A_VERSION="hadoop-aws-3.5.0+sdk-2.35.4"
TOOLS_DIR="${DELAYQ_TOOLS_DIR:-$HOME/.cache/delayq-tools}"
JAR_DIR="$TOOLS_DIR/jars/s3a-$S3A_VERSION"
MAVEN="${DELAYQ_MAVEN_URL:-https://repo1.maven.org/maven2}"
STAMP="$JAR_DIR/.complete"

JARS=$(cat <<'LIST'
org/apache/hadoop/hadoop-aws/3.5.0/hadoop-aws-3.5.0.jar 66bd9eefb938b1a1657487324b63c13df2d8b17164a1dd24e0ef37b905bc5baa
software/amazon/awssdk/annotations/2.35.4/annotations-2.35.4.jar 6f36bd87155d1dd85d6efbdd29e532e3759a022211feb71affebee1aa34f04b8
software/amazon/awssdk/apache-client/2.35.4/apache-client-2.35.4.jar 6eade21b482724ed0a4613eaa95d20e47e7a81304bd28538ac427fece94a7740
software/amazon/awssdk/arns/2.35.4/arns-2.35.4.jar c63cc29f76a8527e9e10b621703163df541dc5cb315508dc2898518602c75380
software/amazon/awssdk/auth/2.35.4/auth-2.35.4.jar 6b601323004833fb4a857ffc95db4795e0e6320eb93e64b1246c655c9ff04994
software/amazon/awssdk/aws-core/2.35.4/aws-core-2.35.4.jar fdb5fc8f1a48d97fa7d04d3460fb42f6973c7b1bbe1b9d317871ef0162bcb623
software/amazon/awssdk/aws-query-protocol/2.35.4/aws-query-protocol-2.35.4.jar 9b4cf9b78977cc9f5b4ceae9c435dedbde6a055a0f8d9e053eaca945715e2a9f
software/amazon/awssdk/aws-xml-protocol/2.35.4/aws-xml-protocol-2.35.4.jar 4f59176da2522c357b1993e4a890fde529f12f365795ef86269bde4a3984cd0d
software/amazon/awssdk/checksums/2.35.4/checksums-2.35.4.jar 94464af4374d08ecf33ca06ed4d03e1615529e547726e26b56abacefbeee7948
software/amazon/awssdk/checksums-spi/2.35.4/checksums-spi-2.35.4.jar 88b5af85ac2d3c862be8856be4e683ab31932e4a5a3c1c45af864d2671ac7cec
software/amazon/awssdk/crt-core/2.35.4/crt-core-2.35.4.jar 2c6aaa17bf9ccbb9d962dded4351e73decb197e3c5519970e0dae17e05d3df62
software/amazon/awssdk/endpoints-spi/2.35.4/endpoints-spi-2.35.4.jar ef02441bda916959b8341290b49c68cc35538e1ad6f8629b75d8334dc6653e00
software/amazon/awssdk/http-auth/2.35.4/http-auth-2.35.4.jar 3ec933a06e751a05e195eb3589209e23c44e1897263b6fcae34ef4cc63cd4491
software/amazon/awssdk/http-auth-aws/2.35.4/http-auth-aws-2.35.4.jar c4acb92fdec90bfd9b67bfab8e41b69cd152c03cacc10281a8ab464791856e01
software/amazon/awssdk/http-auth-aws-eventstream/2.35.4/http-auth-aws-eventstream-2.35.4.jar 709107552f302be3fa9e05969a3779f5c0f07fb809e6fa1fa571a6f0c61326dd
software/amazon/awssdk/http-auth-spi/2.35.4/http-auth-spi-2.35.4.jar 4495463406bb98eb136f2c3f3604ed5f08ec9974ebc3f34f2121b20679f61d5c
software/amazon/awssdk/http-client-spi/2.35.4/http-client-spi-2.35.4.jar 728be89b2a07b595edb0adee3a2cbbbdd4cb1f4caddde0d08c3979fe2620dedb
software/amazon/awssdk/identity-spi/2.35.4/identity-spi-2.35.4.jar 188d73db7d4e2361654bc3c5a1b3eaeb445d0500fb012cc46c5d67975adf97bf
software/amazon/awssdk/json-utils/2.35.4/json-utils-2.35.4.jar 80d67a6bb3e7eb49c7d4b6e4ba4c1463ed7da0192b795158328602dc131c5ecc
software/amazon/awssdk/metrics-spi/2.35.4/metrics-spi-2.35.4.jar c2a4ee90a21081317e2e6eba0c414d05d3d518aed2f86b1c1710a7367b450487
software/amazon/awssdk/netty-nio-client/2.35.4/netty-nio-client-2.35.4.jar b82f8b33e5c85273a47da45ede884d7ccb31c9c2f69e6910a76c5c48fa1275dc
software/amazon/awssdk/profiles/2.35.4/profiles-2.35.4.jar 0f4ef7ca72ccd80dd49ebeaf7f3ce60a7d7a00da59a91aeeae6e91052bbacbd8
software/amazon/awssdk/protocol-core/2.35.4/protocol-core-2.35.4.jar f2532eca6ba2142fe4821d5decb03c83a3e15dc8bfae2240e7f2efa75f9868b5
software/amazon/awssdk/regions/2.35.4/regions-2.35.4.jar 77eae87b34ce96ecdf916a9bc06684dbeafcb6d38ef0513285fa5d5d6d41f5ca
software/amazon/awssdk/retries/2.35.4/retries-2.35.4.jar f99fb2f8c66d7e859955b3542d3af8f9de8f23a21d5e3250f0f2c5f18487e469
software/amazon/awssdk/retries-spi/2.35.4/retries-spi-2.35.4.jar 668638751d059c527ddd41ffa4dcebe36a7c14860ed56776df09b861c14dc7dd
software/amazon/awssdk/s3/2.35.4/s3-2.35.4.jar f23532c5223be9b0bfec0d72837ed09ed34dbdf8022818ba145b20076a78b4bc
software/amazon/awssdk/s3-transfer-manager/2.35.4/s3-transfer-manager-2.35.4.jar 0eec78870b3d0abc509a847072cf963cb2ae6e360dc6161a9449b3398c470476
software/amazon/awssdk/sdk-core/2.35.4/sdk-core-2.35.4.jar fa559a4ce598852f3519c8f3b36250f583b0858a7611eedc4a81997778c617f4
software/amazon/awssdk/third-party-jackson-core/2.35.4/third-party-jackson-core-2.35.4.jar 32f4252c6c2df8f3a4aff885e6dc77024ad6b4cb48455d07b461ec30c41643ea
software/amazon/awssdk/utils/2.35.4/utils-2.35.4.jar 642aeef536a071668f0b772f05f9d21573abf6955e7b6fb5fdb893760cca10e8
software/amazon/awssdk/utils-lite/2.35.4/utils-lite-2.35.4.jar e004806def5e22ec98edc48a133ff3317166255e1ba29d93d129e9fdfa64a7be
software/amazon/eventstream/eventstream/1.0.1/eventstream-1.0.1.jar 0c37d8e696117f02c302191b8110b0d0eb20fa412fce34c3a269ec73c16ce822
software/amazon/s3/analyticsaccelerator/analyticsaccelerator-s3/1.3.1/analyticsaccelerator-s3-1.3.1.jar 4959a9747cbb479c73c3ffbcd479bee5b014f8b2880994585a8693fb9d24675e
org/reactivestreams/reactive-streams/1.0.4/reactive-streams-1.0.4.jar f75ca597789b3dac58f61857b9ac2e1034a68fa672db35055a8fb4509e325f28
LIST
)

print_jars() {
  local out=() path
  while read -r path _; do out+=("$JAR_DIR/${path##*/}"); done <<<"$JARS"
  (IFS=,; echo "${out[*]}")
}

if [ -f "$STAMP" ]; then
  print_jars
  exit 0
fi
command -v curl >/dev/null 2>&1 || { echo "install-s3a-jars: curl not found" >&2; exit 1; }
mkdir -p "$JAR_DIR"
echo "install-s3a-jars: fetching the s3a jars ($S3A_VERSION) into $JAR_DIR (first run only)" >&2
work=$(mktemp -d "$JAR_DIR/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
args=()
while read -r path _; do args+=(-o "$work/${path##*/}" "$MAVEN/$path"); done <<<"$JARS"
curl -fsSL --no-progress-meter --retry 3 --parallel --parallel-max 8 "${args[@]}"
while read -r path sha256; do
  echo "$sha256  $work/${path##*/}" | sha256sum --check --quiet --strict >&2 || {
    echo "install-s3a-jars: ${path##*/} does not match its pinned SHA-256" >&2
    exit 1
  }
done <<<"$JARS"
mv "$work"/*.jar "$JAR_DIR"/
touch "$STAMP"
print_jars
