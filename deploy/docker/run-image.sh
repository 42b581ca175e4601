#!/bin/bash
# `make image-run`: run the image `make image` built, with no container engine, and probe it.
# umoci unpacks the OCI layout into a runtime bundle: the image's root filesystem and a
# config.json holding the image's entrypoint, command, environment, user and working directory.
# Those run chrooted into that filesystem in new mount and pid namespaces (the server is PID 1,
# as in a container), as the image's user, with the model repository bind-mounted read-only at
# /models and the host's network: the ports are free ones, passed as flags after the image's
# CMD as `docker run IMAGE --model-repository /models --http-port ...` would. Then curl checks
# /v2/health/ready, an ONNX infer (simple), a Python-model ensemble infer (pipeline) and the
# metrics from the host; the server is stopped with SIGTERM by its pid.
set -euo pipefail

cd "$(dirname "$0")/../.."
out=$(realpath "${IMAGE_DIR:-.image}")
tag=${IMAGE_TAG:-ascend-serve:0.1.0}
models=$(realpath "${MODEL_REPOSITORY:-examples/models}")
bundle=$out/bundle

for tool in umoci unshare chroot curl jq; do
    if ! command -v "$tool" >/dev/null; then
        echo "run-image: $tool not found: apt-get install umoci curl jq" >&2
        exit 2
    fi
done
if [[ ! -d $out/oci ]]; then
    echo "run-image: no image in $out/oci: run make image first" >&2
    exit 2
fi
if [[ ! -f $models/simple/config.pbtxt ]]; then
    echo "run-image: no example repository at $models: run make models first" >&2
    exit 2
fi

rm -rf "$bundle"
umoci unpack --image "$out/oci:$tag" "$bundle" >/dev/null
rootfs=$bundle/rootfs
config=$bundle/config.json

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
http=${HTTP_PORT:-$(free_port)}
grpc=${GRPC_PORT:-$(free_port)}
metrics=${METRICS_PORT:-$(free_port)}

mapfile -t args < <(jq -r '.process.args[]' "$config")
mapfile -t env < <(jq -r '.process.env[]' "$config")
cwd=$(jq -r '.process.cwd' "$config")
user=$(jq -r '"\(.process.user.uid):\(.process.user.gid)"' "$config")
args+=(--http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics")
echo "run-image: $tag as $user in $cwd: ${args[*]}"

# Inside the new namespaces: /dev and the repository bound into the rootfs (private mounts,
# gone with the namespace), then chroot as the image's user with only the image's environment.
# shellcheck disable=SC2016  # expanded by the inner shell
inner='rootfs=$1 models=$2 user=$3 cwd=$4; shift 4
mount --rbind /dev "$rootfs/dev"
mkdir -p "$rootfs/models"
mount --bind -o ro "$models" "$rootfs/models"
exec chroot --userspec="$user" "$rootfs" /usr/bin/env -i -C "$cwd" "$@"'
log=$out/run.log
unshare --pid --fork --mount-proc="$rootfs/proc" \
    sh -c "$inner" sh "$rootfs" "$models" "$user" "$cwd" "${env[@]}" "${args[@]}" \
    >"$log" 2>&1 &
outer=$!

server=""
stop() {
    if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then
        kill -TERM "$server"
    fi
    for _ in $(seq 60); do
        kill -0 "$outer" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$outer" 2>/dev/null; then
        echo "run-image: server did not stop in 30 s; killing it" >&2
        [[ -n $server ]] && kill -KILL "$server" 2>/dev/null
        wait "$outer" 2>/dev/null || true
    fi
}
trap stop EXIT

for _ in $(seq 120); do
    server=$(ps -o pid= --ppid "$outer" | tr -d ' ' || true)
    [[ -n $server ]] && break
    sleep 0.25
done
base=http://127.0.0.1:$http
ready=""
for _ in $(seq 120); do
    if ! kill -0 "$outer" 2>/dev/null; then
        echo "run-image: the server exited; its log:" >&2
        cat "$log" >&2
        exit 1
    fi
    if curl -sf -o /dev/null "$base/v2/health/ready"; then
        ready=yes
        break
    fi
    sleep 0.5
done
if [[ -z $ready ]]; then
    echo "run-image: not ready in 60 s; its log:" >&2
    cat "$log" >&2
    exit 1
fi

echo "run-image: server pid $server (host), $(stat -c 'uid %u' "/proc/$server"), root" \
    "$(readlink "/proc/$server/root")"
echo "\$ curl -i $base/v2/health/ready"
curl -sS -i "$base/v2/health/ready"
echo
ones=$(printf '1,%.0s' $(seq 16))
simple='{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32",'
simple+='"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},'
simple+='{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":['${ones%,}']}]}'
echo "\$ curl -X POST $base/v2/models/simple/infer -d '$simple'"
result=$(curl -sS -f -X POST "$base/v2/models/simple/infer" -d "$simple")
echo "$result"
jq -e '.outputs[0].data == [range(1;17)]' <<<"$result" >/dev/null

red=$(python3 -c 'import json; print(json.dumps({"inputs": [{"name": "IMAGE",
    "shape": [1, 32, 32, 3], "datatype": "UINT8", "data": [255, 0, 0] * 1024}]}))')
echo "\$ curl -X POST $base/v2/models/pipeline/infer -d <a red 32x32 UINT8 image>"
result=$(curl -sS -f -X POST "$base/v2/models/pipeline/infer" -d "$red")
echo "$result"
jq -e '.outputs | length > 0' <<<"$result" >/dev/null

echo "\$ curl -s 127.0.0.1:$metrics/metrics | grep 'nv_inference_count{'"
curl -sS "http://127.0.0.1:$metrics/metrics" | grep 'nv_inference_count{'
echo "run-image: ok"
