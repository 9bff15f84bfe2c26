#!/usr/bin/env bash
# Checks a built edgewatch .deb without installing it: control fields, the file list and
# modes, the conffile, the packaged config (data_dir, and `edgewatch check-config` with the
# packaged binary: natively or under qemu-aarch64-static), the maintainer scripts (sh -n),
# and the systemd unit with `systemd-analyze verify` (any warning fails) plus its
# `systemd-analyze security` exposure score, where systemd-analyze exists.
#
# Usage: packaging/verify-deb.sh PACKAGE.deb
set -euo pipefail
deb=${1:?usage: packaging/verify-deb.sh PACKAGE.deb}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "VERIFY FAILED: $*" >&2; exit 1; }

arch=$(dpkg-deb -f "$deb" Architecture)
echo "==> $deb: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $arch"
echo "    Depends: $(dpkg-deb -f "$deb" Depends)"
[ "$(dpkg-deb -f "$deb" Package)" = edgewatch ] || fail "package name"
dpkg-deb -f "$deb" Depends | grep -q adduser || fail "Depends lacks adduser"

dpkg-deb -c "$deb" | awk '{print $1, $2, $6}' | sed 's|\./|/|' >"$work/list"
expect() { # mode owner path
    grep -qxF -- "$1 $2 $3" "$work/list" || fail "expected '$1 $2 $3' in the package, got: $(grep -F -- " $3" "$work/list" || echo nothing)"
}
expect -rwxr-xr-x root/root /usr/bin/edgewatch
expect -rw-r--r-- root/root /etc/edgewatch/edgewatch.toml
expect -rw-r--r-- root/root /lib/systemd/system/edgewatch.service
expect drwxr-x--- root/root /var/lib/edgewatch/
expect -rw-r--r-- root/root /usr/share/doc/edgewatch/copyright
expect -rw-r--r-- root/root /usr/share/doc/edgewatch/README.md.gz
n_files=$(grep -v '^d' "$work/list" | grep -vc ' /usr/share/doc/edgewatch/docs/')
[ "$n_files" = 5 ] || fail "expected 5 files besides docs/, found $n_files: $(grep -v '^d' "$work/list")"
# The reference pages the README links to: at least one, each a readable .md.gz.
n_pages=$(grep -c '^-rw-r--r-- root/root /usr/share/doc/edgewatch/docs/[a-z-]*\.md\.gz$' "$work/list" || true)
n_docs=$(grep -v '^d' "$work/list" | grep -c ' /usr/share/doc/edgewatch/docs/' || true)
[ "$n_pages" -ge 1 ] && [ "$n_pages" = "$n_docs" ] || fail "docs pages: $n_pages of $n_docs as -rw-r--r-- root/root *.md.gz"
echo "    files and modes ok"

dpkg-deb -e "$deb" "$work/DEBIAN"
[ "$(cat "$work/DEBIAN/conffiles")" = /etc/edgewatch/edgewatch.toml ] || fail "conffiles"
for s in postinst prerm postrm; do
    [ -x "$work/DEBIAN/$s" ] || fail "$s missing or not executable"
    sh -n "$work/DEBIAN/$s" || fail "$s: syntax"
done
grep -q '#VERSION#' "$work/DEBIAN/postinst" && fail "postinst: version placeholder not substituted"
echo "    conffiles, maintainer scripts ok"

dpkg-deb -x "$deb" "$work/root"
cfg="$work/root/etc/edgewatch/edgewatch.toml"
grep -qx 'data_dir = "/var/lib/edgewatch"' "$cfg" || fail "packaged config does not set data_dir"
bin="$work/root/usr/bin/edgewatch"
run_bin=()
case "$arch" in
    amd64) [ "$(uname -m)" = x86_64 ] && run_bin=("$bin") ;;
    arm64)
        if [ "$(uname -m)" = aarch64 ]; then
            run_bin=("$bin")
        elif command -v qemu-aarch64-static >/dev/null; then
            run_bin=(env "QEMU_LD_PREFIX=${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}" qemu-aarch64-static "$bin")
        fi
        ;;
esac
if [ ${#run_bin[@]} -gt 0 ]; then
    "${run_bin[@]}" check-config "$cfg" >"$work/check.out" || fail "check-config rejected the packaged config"
    grep -q 'data_dir: "/var/lib/edgewatch"' "$work/check.out" || fail "effective data_dir is not /var/lib/edgewatch"
    echo "    packaged config: $("${run_bin[@]}" --version), check-config ok, data_dir /var/lib/edgewatch"
else
    echo "    packaged config: data_dir ok (binary not runnable here; check-config skipped)"
fi

if command -v systemd-analyze >/dev/null; then
    # verify needs the unit's dependencies (sysinit.target, ...) under the same root.
    cp -n /lib/systemd/system/*.target /lib/systemd/system/*.slice "$work/root/lib/systemd/system/" 2>/dev/null || true
    out=$(systemd-analyze verify --root="$work/root" edgewatch.service 2>&1) || fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify warned: $out"
    echo "    systemd-analyze verify: clean ($(systemd-analyze --version | head -n1))"
    score=$(systemd-analyze security --offline=true --root="$work/root" edgewatch.service 2>/dev/null |
        sed -n 's/.*Overall exposure level for edgewatch.service: //p' || true)
    [ -n "$score" ] && echo "    systemd-analyze security: exposure $score"
else
    echo "    systemd-analyze not installed: unit not verified"
fi
echo "==> $deb verified"
