#!/usr/bin/env python3
"""Every dependency's declared rust-version is at most ours (scripts/publish-check.sh).

For each published package of the workspace (the library, with all its
features, and the command-line tool), walks its locked dependency graph
(normal and build dependencies; not dev-dependencies, which users never
build) on Linux, macOS and Windows, and fails if a package in it declares a
`rust-version` above the one the published package declares. Prints the
highest requirement found and the path that brings it in.

Not checked: dependencies that declare no `rust-version` (counted and
listed), and a fresh resolution without Cargo.lock, which may pick newer
versions. Run from the repository root; needs only cargo and Python 3.
"""

import json
import subprocess
import sys

ROOTS = ["leaderelection", "leaderelection-cli"]
PLATFORMS = ["x86_64-unknown-linux-gnu", "aarch64-apple-darwin", "x86_64-pc-windows-msvc"]


def version(text):
    """'1.85' or '1.85.0' as a comparable tuple (1, 85, 0)."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def metadata(platform):
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked",
         "--filter-platform", platform],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def graph(meta, root):
    """Package id -> the id that brought it in, for root's normal and build deps."""
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    parent = {root: None}
    stack = [root]
    while stack:
        pid = stack.pop()
        for dep in nodes[pid]["deps"]:
            if not any(k["kind"] in (None, "build") for k in dep["dep_kinds"]):
                continue
            if dep["pkg"] not in parent:
                parent[dep["pkg"]] = pid
                stack.append(dep["pkg"])
    return parent


def main():
    failed = False
    for platform in PLATFORMS:
        meta = metadata(platform)
        packages = {p["id"]: p for p in meta["packages"]}
        for name in ROOTS:
            root = next(p for p in meta["packages"] if p["name"] == name and p["source"] is None)
            ours = root.get("rust_version")
            if not ours:
                print(f"msrv-deps: {name} declares no rust-version")
                failed = True
                continue
            parent = graph(meta, root["id"])
            declared = [(version(packages[i]["rust_version"]), i) for i in parent
                        if i != root["id"] and packages[i].get("rust_version")]
            undeclared = sorted(packages[i]["name"] for i in parent
                                if i != root["id"] and not packages[i].get("rust_version"))
            top, top_id = max(declared)

            def chain(pid):
                names = []
                while pid is not None:
                    names.append(f"{packages[pid]['name']} {packages[pid]['version']}")
                    pid = parent[pid]
                return " <- ".join(names)

            over = sorted(((v, i) for v, i in declared if v > version(ours)), reverse=True)
            status = "FAIL" if over else "ok"
            print(f"msrv-deps: {status} {name} {ours} on {platform}: {len(parent) - 1} dependencies, "
                  f"highest {packages[top_id]['rust_version']} ({chain(top_id)}); "
                  f"{len(undeclared)} declare none")
            for v, i in over:
                print(f"  needs {packages[i]['rust_version']} > {ours}: {chain(i)}")
            failed |= bool(over)
    if failed:
        print("msrv-deps: raise rust-version in the manifests to the highest requirement above "
              "(or pin the dependency lower in Cargo.lock)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
