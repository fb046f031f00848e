#!/usr/bin/env bash
# server/'s layers include only downward (README "Layout"): common <- ops <- serving <- grpc, http
# <- app <- cli, with grpc and http independent of each other; server/serving/ includes no gRPC,
# protobuf or HTTP library header; no server/ CMakeLists references the CLI library or uses
# REMOVE_ITEM. Fails naming the file and the include that breaks a rule.
#   tests/server/layering_test.sh [REPO]
set -euo pipefail
repo="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
cd "$repo/server"
failed=0
fail() { echo "layering: $*"; failed=1; }

# The layers each folder may include from (itself included).
declare -A allowed=(
  [common]="common"
  [ops]="common ops"
  [serving]="common ops serving"
  [grpc]="common ops serving grpc"
  [http]="common ops serving http"
  [app]="common ops serving grpc http app"
  [cli]="common ops serving grpc http app cli"
)
for layer in "${!allowed[@]}"; do
  while IFS= read -r hit; do
    file="${hit%%:*}"
    target="$(sed -E 's/.*#include "server\/([a-z_]+)\/.*/\1/' <<<"$hit")"
    [[ " ${allowed[$layer]} " == *" $target "* ]] || fail "$file includes server/$target/ (above $layer)"
  done < <(grep -rn --include='*.h' --include='*.cc' -E '#include "server/[a-z_]+/' "$layer" || true)
done
# The transport-free core.
if hits=$(grep -rn --include='*.h' --include='*.cc' -E \
    '#include [<"](grpc|grpcpp|google/protobuf|google/rpc|flux2/v1|httplib|boost)' serving); then
  fail "server/serving/ includes a transport header:"; echo "$hits"
fi
if grep -rn -E 'flux2_cli_lib|REMOVE_ITEM' --include=CMakeLists.txt . | grep -v '^./cli/'; then
  fail "a server/ CMakeLists.txt outside cli/ references the CLI library or uses REMOVE_ITEM"
fi
if grep -rn 'REMOVE_ITEM' --include=CMakeLists.txt cli; then fail "cli/ uses REMOVE_ITEM"; fi
(( failed == 0 )) && echo "layering: every include in server/ points to its own layer or below"
exit "$failed"
