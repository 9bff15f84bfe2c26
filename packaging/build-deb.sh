#!/usr/bin/env bash
# Builds the edgewatch .deb from an already built binary, with dpkg-deb from a staged tree
# (no cargo-deb needed). Package metadata comes from [package.metadata.deb] in Cargo.toml.
#
# Usage: packaging/build-deb.sh BINARY [OUT_DIR]
#   BINARY   a release binary: target/release/edgewatch (amd64) or
#            target/aarch64-unknown-linux-gnu/release/edgewatch (arm64); the Debian
#            architecture is read from the ELF header.
#   OUT_DIR  where the .deb goes (default: target/debian)
#   DEB_REVISION=N overrides the Debian revision ([package.metadata.deb] revision).
#
# The package holds:
#   /usr/bin/edgewatch
#   /etc/edgewatch/edgewatch.toml         conffile: config/edgewatch.toml with
#                                         [storage] data_dir = "/var/lib/edgewatch"
#   /lib/systemd/system/edgewatch.service packaging/edgewatch.service
#   /var/lib/edgewatch/                   data (owned by user edgewatch, made in postinst)
#   /usr/share/doc/edgewatch/             copyright, README.md.gz, docs/*.md.gz
# and the maintainer scripts of packaging/debian/. Depends: adduser, plus libc6 (>= the
# newest GLIBC_x.y symbol version the binary uses) and libgcc for a glibc binary; nothing
# more for a static (musl) one.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:?usage: packaging/build-deb.sh BINARY [OUT_DIR]}
out=${2:-${CARGO_TARGET_DIR:-target}/debian}
[ -x "$bin" ] || { echo "error: $bin is not an executable file" >&2; exit 1; }

# --- metadata -------------------------------------------------------------------------
meta=$(cargo metadata --no-deps --format-version 1 --offline 2>/dev/null || cargo metadata --no-deps --format-version 1)
field() {
    python3 -c '
import json, sys
m = json.load(sys.stdin)
p = next(p for p in m["packages"] if p["name"] == "edgewatch")
key = sys.argv[1]
if key in ("version", "description", "license", "homepage"):
    print(p.get(key) or "")
else:
    print(((p.get("metadata") or {}).get("deb") or {}).get(key, ""))
' "$1" <<<"$meta"
}
version=$(field version)
revision=${DEB_REVISION:-$(field revision)}
debversion="$version${revision:+-$revision}"
maintainer=$(field maintainer)
section=$(field section)
priority=$(field priority)
extra_depends=$(field depends)
# Synopsis: the package description up to its first colon (Debian wants < 80 chars).
summary=$(field description | cut -d: -f1)
extended=$(field extended-description)
license=$(field license)
copyright=$(field copyright)
[ -n "$version" ] && [ -n "$maintainer" ] || { echo "error: [package.metadata.deb] incomplete" >&2; exit 1; }

# --- architecture and dependencies from the ELF file ----------------------------------
machine=$(LC_ALL=C readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
case "$machine" in
    AArch64) arch=arm64 ;;
    "Advanced Micro Devices X86-64") arch=amd64 ;;
    *) echo "error: unsupported ELF machine '$machine' in $bin" >&2; exit 1 ;;
esac

depends=()
needed=$(LC_ALL=C readelf -dW "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
if [ -n "$needed" ]; then
    glibc=$(LC_ALL=C readelf -VW "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
    for lib in $needed; do
        case "$lib" in
            libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | ld-linux-*.so.* | ld-linux.so.*)
                dep="libc6 (>= $glibc)" ;;
            libgcc_s.so.1) dep="libgcc-s1 | libgcc1" ;;
            *) echo "error: $bin needs $lib; map it to a Debian package in packaging/build-deb.sh" >&2; exit 1 ;;
        esac
        case " ${depends[*]-} " in *" $dep "*) ;; *) depends+=("$dep") ;; esac
    done
    linkage="dynamic, glibc >= $glibc"
else
    linkage="static"
fi
[ -n "$extra_depends" ] && depends+=("$extra_depends")
depends_line=$(IFS=,; echo "${depends[*]}" | sed 's/,/, /g')

# --- staged tree -----------------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/edgewatch_${debversion}_$arch"
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/etc/edgewatch" \
    "$root/lib/systemd/system" "$root/usr/share/doc/edgewatch"
install -d -m 0750 "$root/var/lib/edgewatch"
install -m 0755 "$bin" "$root/usr/bin/edgewatch"

# The packaged config is the built-in default with exactly one line changed.
sed 's|^data_dir = "edgewatch-data"$|data_dir = "/var/lib/edgewatch"|' config/edgewatch.toml \
    >"$root/etc/edgewatch/edgewatch.toml"
chmod 0644 "$root/etc/edgewatch/edgewatch.toml"
changed=$(diff config/edgewatch.toml "$root/etc/edgewatch/edgewatch.toml" | grep -c '^>' || true)
if [ "$changed" != 1 ] || ! grep -qx 'data_dir = "/var/lib/edgewatch"' "$root/etc/edgewatch/edgewatch.toml"; then
    echo "error: could not set data_dir in the packaged config (config/edgewatch.toml changed?)" >&2
    exit 1
fi

install -m 0644 packaging/edgewatch.service "$root/lib/systemd/system/edgewatch.service"
gzip -9n <README.md >"$root/usr/share/doc/edgewatch/README.md.gz"
chmod 0644 "$root/usr/share/doc/edgewatch/README.md.gz"
# The reference pages the README links to (docs/*.md), beside it.
mkdir -p "$root/usr/share/doc/edgewatch/docs"
for page in docs/*.md; do
    gzip -9n <"$page" >"$root/usr/share/doc/edgewatch/docs/$(basename "$page").gz"
    chmod 0644 "$root/usr/share/doc/edgewatch/docs/$(basename "$page").gz"
done
cat >"$root/usr/share/doc/edgewatch/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: edgewatch

Files: *
Copyright: $copyright
License: $license
 On Debian systems, the full text of the Apache License 2.0 can be found in
 /usr/share/common-licenses/Apache-2.0.
EOF
chmod 0644 "$root/usr/share/doc/edgewatch/copyright"

for s in postinst prerm postrm; do
    sed "s/#VERSION#/$debversion/g" "packaging/debian/$s" >"$root/DEBIAN/$s"
    chmod 0755 "$root/DEBIAN/$s"
done
echo /etc/edgewatch/edgewatch.toml >"$root/DEBIAN/conffiles"
chmod 0644 "$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | grep -zv '^etc/' |
    sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"

installed_kb=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
{
    echo "Package: edgewatch"
    echo "Version: $debversion"
    echo "Architecture: $arch"
    echo "Maintainer: $maintainer"
    echo "Installed-Size: $installed_kb"
    echo "Depends: $depends_line"
    echo "Section: $section"
    echo "Priority: $priority"
    echo "Description: $summary"
    # Extended description: each line indented by one space, empty lines as " ."
    printf '%s\n' "$extended" | sed -e '/^[[:space:]]*$/d' -e 's/^/ /'
} >"$root/DEBIAN/control"

mkdir -p "$out"
deb="$out/edgewatch_${debversion}_$arch.deb"
if dpkg-deb --help 2>/dev/null | grep -q -- --root-owner-group; then
    dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
else
    fakeroot dpkg-deb -Zxz --build "$root" "$deb" >/dev/null
fi
echo "==> $deb ($arch, $linkage, $(stat -c %s "$deb") bytes)"
