#!/usr/bin/env bash
# Stages what scripts/gpu-issue30.sh runs into .gpu/ (carried by the device tool, 64 MiB
# with the tree): the GPU test binaries of the crates with GPU tests, the examples and the
# bench package's binaries (release, all features, stripped), NCCL 2.30.7's source and
# build script (../shared), and nccl-tests' source if $NCCL_TESTS_TGZ (default
# ../shared/nccl-tests.tar.gz) holds it: this repository does not carry nccl-tests, and
# the GPU machine cannot download it.
#
#   bash scripts/stage-issue30.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
rm -rf .gpu && mkdir -p .gpu/bin
json=$(mktemp)
cargo test --release --all-features --no-run --message-format=json \
  -p nccl-channel -p cuda-hal -p cuda-dl-sys -p nccl-sys > "$json"
cargo build --release --all-features --message-format=json -p nccl-bench --bins \
  -p nccl-channel --example allgather --example data_parallel --example tensor_parallel >> "$json"
python3 - "$json" <<'PY'
import json, os, shutil, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if not exe:
        continue
    pkg = os.path.basename(os.path.dirname(m["manifest_path"]))
    name = os.path.basename(exe)
    if m["profile"]["test"]:
        if m["target"]["kind"] != ["test"]:
            continue  # unit tests have no GPU tests
        name = "test-" + pkg + "-" + m["target"]["name"]
    shutil.copy2(exe, os.path.join(".gpu/bin", name))
    print("staged", name)
PY
rm -f "$json"
strip --strip-all .gpu/bin/*
# What gpu-issue30.sh runs, packed (the binaries link the simulators too: 90 MB as they are,
# 14 MB packed); it unpacks them there.
keep="test-nccl-channel-suite test-cuda-hal-suite test-cuda-sys-suite test-nccl-sys-suite
  data_parallel tensor_parallel allgather bench pool-policy"
(cd .gpu/bin && tar cf - $keep | xz -T0 -6 > ../bins.tar.xz)
rm -rf .gpu/bin
shared=$(cd .. && pwd)/shared
cp "$shared"/nccl/nccl-*.tar.gz "$shared"/gpu/build-nccl .gpu/
tgz=${NCCL_TESTS_TGZ:-$shared/nccl-tests.tar.gz}
# Not named nccl-*.tar.gz: build-nccl builds the last of those.
if [ -f "$tgz" ]; then cp "$tgz" .gpu/nccltests.tar.gz; else echo "no nccl-tests source at $tgz: the perf parts will skip nccl-tests"; fi
du -sh .gpu .gpu/* | sort -h
total=$(( $(du -sb .gpu | cut -f1) + $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "carried: about $(( total >> 20 )) MiB of 64"
