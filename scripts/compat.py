#!/usr/bin/env python3
"""Compatibility table: one NCCL release per minor version, each loaded through nccl-sys.

    scripts/compat.py                 # every minor version from the minimum to the newest
    scripts/compat.py 2.18.3 2.32.3   # just these (CI: the oldest and the newest)

For each version it downloads the `nvidia-nccl-cu12` wheel (cached under
~/.cache/nccl-rs/compat), runs `nccl-sys/examples/compat_row.rs` against its libnccl.so.2
(without and with NCCL_COMM_ID), compares the signatures that nccl.h of that release
declares for the table's functions with the ones our bindings were generated from (2.32.3),
and prints a Markdown table. Exits non-zero when a supported version fails to load, gives
bad ids, or declares a different signature for a function the table would take from it.
Needs python3 with pip, cargo, and network access to the package registry.
"""
import os, re, subprocess, sys, zipfile, pathlib, socket

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = pathlib.Path(os.environ.get("NCCL_RS_COMPAT_CACHE", pathlib.Path.home() / ".cache/nccl-rs/compat"))
VERSIONS = ["2.18.3", "2.19.3", "2.20.5", "2.21.5", "2.22.3", "2.23.4", "2.24.3", "2.25.1",
            "2.26.5", "2.27.7", "2.28.9", "2.29.7", "2.30.7", "2.31.2", "2.32.3"]
REFERENCE = "2.32.3"


def fetch(version):
    dest = CACHE / version
    lib, hdr = dest / "libnccl.so.2", dest / "nccl.h"
    if lib.exists() and hdr.exists():
        return lib, hdr
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_18_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--python-version", "3.11", "-d", str(dest), f"nvidia-nccl-cu12=={version}"], check=True)
    whl = next(dest.glob("*.whl"))
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.endswith("lib/libnccl.so.2"):
                lib.write_bytes(z.read(name))
            elif name.endswith("include/nccl.h"):
                hdr.write_bytes(z.read(name))
    whl.unlink()
    return lib, hdr


def prototypes(header):
    """nccl* function -> parameter types (names dropped), from a header's text."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", header.read_text(), flags=re.S)
    out = {}
    for ret, name, params in re.findall(r"(ncclResult_t|const char\s*\*|void)\s*(nccl\w+)\s*\(([^;{]*?)\)\s*;", text, flags=re.S):
        types = []
        for p in params.split(","):
            p = " ".join(p.replace("*", " * ").split())
            toks = p.split(" ")
            if len(toks) > 1 and toks[-1] not in ("*", "void") and re.match(r"^\w+$", toks[-1]):
                toks = toks[:-1]
            types.append(" ".join(toks).replace(" * ", "*").replace(" *", "*"))
        out[name] = (" ".join(ret.split()), tuple(types))
    return out


def row(exe, version, lib):
    env = dict(os.environ)
    env.pop("NCCL_COMM_ID", None)
    out = subprocess.run([exe, str(lib)], capture_output=True, text=True, env=env, timeout=120).stdout
    kv = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env["NCCL_COMM_ID"] = f"127.0.0.1:{port}"
    out = subprocess.run([exe, "--comm-id", str(lib)], capture_output=True, text=True, env=env, timeout=120).stdout
    kv.update(dict(l.split("=", 1) for l in out.splitlines() if "=" in l))
    return kv


def main():
    versions = sys.argv[1:] or VERSIONS
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "nccl-sys", "--example", "compat_row"], cwd=ROOT, check=True)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    exe = str(target / "release/examples/compat_row")
    ref = prototypes(fetch(REFERENCE)[1])
    print("| NCCL | loaded | optional functions present | unique id | comm init without a GPU | ids from NCCL_COMM_ID | signatures vs 2.32.3 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    bad = False
    for v in versions:
        lib, hdr = fetch(v)
        kv = row(exe, v, lib)
        protos = prototypes(hdr)
        present = [f for f in kv.get("optional_list", "").split(",") if f]
        # Every function the table would take from this library must have our signature.
        table_fns = [f for f in protos if f in ref and not f.startswith("pnccl")]
        diffs = [f for f in table_fns if protos[f] != ref[f]]
        used_diffs = [f for f in diffs if (f in present) or (f in REQUIRED)]
        sig = "same" if not diffs else ("differs, unused: " + ", ".join(diffs) if not used_diffs else "DIFFERS: " + ", ".join(used_diffs))
        loaded = kv.get("loaded", "no")
        print(f"| {v} | {loaded} | {kv.get('optional_present', '-')}/{kv.get('optional_total', '-')} | {kv.get('unique_id', '-')} "
              f"| {kv.get('init_without_gpu', '-')} | {kv.get('comm_id_identical', '-')} | {sig} |", flush=True)
        # Ids from NCCL_COMM_ID that differ are a property of the release (nccl-channel
        # refuses to derive ids there), not a failure of the bindings.
        if loaded != "yes" or not kv.get("unique_id", "").startswith("ok") or used_diffs:
            bad = True
    sys.exit(1 if bad else 0)


REQUIRED = set("""ncclGetVersion ncclGetUniqueId ncclCommInitRankConfig ncclCommInitRank ncclCommInitAll
ncclCommFinalize ncclCommDestroy ncclCommAbort ncclCommSplit ncclGetErrorString ncclGetLastError
ncclCommGetAsyncError ncclCommCount ncclCommCuDevice ncclCommUserRank ncclRedOpCreatePreMulSum
ncclRedOpDestroy ncclReduce ncclBcast ncclBroadcast ncclAllReduce ncclReduceScatter ncclAllGather
ncclSend ncclRecv ncclGroupStart ncclGroupEnd""".split())

if __name__ == "__main__":
    main()
