#!/usr/bin/env bash
# Build a real Kubernetes 1.20.2 control plane (kube-apiserver, kube-controller-manager, kube-scheduler) and
# its node agent (kubelet, with the dockershim that kubelet.sh runs pods through) from Debian bookworm's
# `kubernetes` source package with Debian's Go, offline, once: the binaries are cached by source version and
# recipe revision in $FSDP_JOBS_KUBE_CACHE (default ~/.cache/fsdp-jobs/kube-dev), so a second run on the same
# machine takes a second. Prints the bin dir.
#
# The recipe's two fixes, numbered as pitfalls in README.md beside this file (with what else was learnt):
#   K1  pkg/generated/openapi/zz_generated.openapi.go is not in the tarball: run openapi-gen as make does.
#   K2  the vendored reflect2 1.0.1 segfaults under Go >= 1.18 on the first custom object: Debian's 1.0.2
#       (and json-iterator 1.1.12) replace it.
# The system's apt sources are not touched: the deb-src index lives in the cache's own apt state.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
VERSION=1.20.2
RECIPE=3  # raise when a change below changes the binaries: the cache is keyed by it (2: -N -l, GOGC; 3: kubelet)
HERE=$(cd "$(dirname "$0")" && pwd)
KEY=$VERSION-r$RECIPE
CACHE=${FSDP_JOBS_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-jobs/kube-dev}
OUT=$CACHE/$KEY
BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet"

say() { echo "dev-apiserver build: $*" >&2; }
have_all() { for b in $BINS pause; do [ -x "$OUT/bin/$b" ] || return 1; done; [ -f "$OUT/built" ]; }

# the runtime pieces, wanted even when the binaries are cached (a machine that kept the cache but not the
# packages): etcd, openssl for the certificates; Go and the source only for a build
need_packages() {
  local missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  [ "${1:-}" = build ] && ! command -v go >/dev/null && missing+=(golang-go)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || { apt-get update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
}

if have_all; then need_packages; echo "$OUT/bin"; exit 0; fi
# one build at a time (.ci/run starts one early in the background; the tests' start.sh then waits for it)
mkdir -p "$CACHE"; exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then say "another build is running: waiting for it"; flock 9; fi
if have_all; then need_packages; echo "$OUT/bin"; exit 0; fi
need_packages build
t0=$(date +%s)
W=$CACHE/work-$KEY; rm -rf "$W"; mkdir -p "$W/apt/lists/partial" "$W/apt/sources.list.d" "$W/gopath/src/k8s.io" "$OUT/bin"
cd "$W"

# the source package, through a private apt state that knows a deb-src line (the system's apt config stays as is)
uri=$(grep -h "^URIs:" /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | cut -d" " -f2)
[ -n "$uri" ] || uri=$(grep -h "^deb " /etc/apt/sources.list 2>/dev/null | head -1 | cut -d" " -f2)
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri bookworm main" > "$W/apt/sources.list"
APT=(-o Dir::Etc::sourcelist="$W/apt/sources.list" -o Dir::Etc::sourceparts="$W/apt/sources.list.d"
     -o Dir::State::Lists="$W/apt/lists" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
say "fetching the kubernetes source package"
apt-get "${APT[@]}" update -qq
apt-get "${APT[@]}" source --download-only -qq kubernetes >/dev/null
tar xzf kubernetes_*.orig.tar.gz
SRC=$(find "$W" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
ln -sfn "$SRC" "$W/gopath/src/k8s.io/kubernetes"
export GOPATH=$W/gopath GOCACHE=$W/gocache GO111MODULE=off GOFLAGS= CGO_ENABLED=0 GOPROXY=off
cd "$GOPATH/src/k8s.io/kubernetes"

# K2: reflect2 1.0.2 + json-iterator 1.1.12 from Debian's Go packages (downloaded, unpacked here, not installed)
(cd "$W" && apt-get -o APT::Sandbox::User=root download -qq golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev >/dev/null)
for d in "$W"/golang-github-modern-go-reflect2-dev_*.deb "$W"/golang-github-json-iterator-go-dev_*.deb; do
  dpkg-deb -x "$d" "$W/debx"; done
rm -rf vendor/github.com/modern-go/reflect2 vendor/github.com/json-iterator/go
cp -r "$W/debx/usr/share/gocode/src/github.com/modern-go/reflect2" vendor/github.com/modern-go/
cp -r "$W/debx/usr/share/gocode/src/github.com/json-iterator/go" vendor/github.com/json-iterator/
find vendor/github.com/modern-go/reflect2 vendor/github.com/json-iterator/go -name '*_test.go' -delete

# K1: generate the OpenAPI definitions the way the Makefile does (its violation report then equals upstream's)
say "generating pkg/generated/openapi"
nice -n 19 go build -o "$W/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
DIRS=$(find -H . \( -not \( \( -path ./_\* -o -path ./.\* -o -path ./vendor \) -prune \) \) -type f -name '*.go' \
  | sed 's|^./staging/src|vendor|; s|/[^/]*$||; s|^./||' | LC_ALL=C sort -u | while read -r d; do ls "$d"/*.go 2>/dev/null; done \
  | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' | xargs grep -l '^// *+k8s:' \
  | xargs grep -l '+k8s:openapi-gen=' | xargs -n1 dirname | LC_ALL=C sort -u)
nice -n 19 "$W/openapi-gen" --logtostderr=false -i "$(echo "$DIRS" | sed 's|^|k8s.io/kubernetes/|' | paste -sd,)" \
  -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
  -r "$W/openapi-violations.report" -o "$GOPATH/src"
cmp -s "$W/openapi-violations.report" api/api-rules/violation_exceptions.list \
  || say "note: openapi-gen's violation report differs from upstream's list (inputs differ from make's)"

# the four binaries in one go build (they share most packages), version stamped so the server says v1.20.2
say "building $BINS (about 6 CPU-minutes; nice 19)"
LD="-s -w"; for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD="$LD -X k8s.io/kubernetes/vendor/$p.gitVersion=v$VERSION -X k8s.io/kubernetes/vendor/$p.gitMajor=1"
  LD="$LD -X k8s.io/kubernetes/vendor/$p.gitMinor=20 -X k8s.io/kubernetes/vendor/$p.gitTreeState=clean"; done
# unoptimized and not inlined (-N -l), the compiler's collector at 4x its default heap growth (GOGC=400): a
# quarter less CPU for a new machine's whole build.sh, which CI always is. The binaries only serve a dev
# control plane: the slower API server costs the Kubernetes tier much less CPU than the build saves
# (fsdp_jobs/bench/README.md, "The test machinery")
GOGC=400 nice -n 19 go build -p 2 -gcflags="all=-N -l" -tags selinux,notest -ldflags "$LD" -o "$OUT/bin/" \
  $(for b in $BINS; do echo "./cmd/$b"; done)
# the pod sandbox's process (pause.go: the source tree's pause.c needs a C toolchain, which CI may not have)
(cd "$HERE" && GO111MODULE=off nice -n 19 go build -ldflags "-s -w" -o "$OUT/bin/pause" pause.go)
cp "$HERE/README.md" "$OUT/" 2>/dev/null || true
echo "built in $(( $(date +%s) - t0 )) s on $(date -u +%FT%TZ) from $(basename "$(ls "$W"/kubernetes_*.dsc)")" > "$OUT/built"
cd / && rm -rf "$W"   # 1.3 GB of Go cache and 400 MB of source: only the binaries are kept
say "$(cat "$OUT/built")"
echo "$OUT/bin"
