#!/usr/bin/env bash
# Cross-builds edgewatch release binaries on an x86-64 Debian/Ubuntu host.
#
# Usage: cross/build.sh [TARGET...]        (default: aarch64-unknown-linux-gnu)
#
#   aarch64-unknown-linux-gnu   Jetson / any arm64 glibc Linux. Linker and C compiler for the
#                               bundled SQLite: Debian's gcc-aarch64-linux-gnu.
#   x86_64-unknown-linux-gnu    native build, for the amd64 package.
#   aarch64-unknown-linux-musl  fully static: runs on every JetPack (4 to 7) whatever its
#                               glibc. Same gcc, musl headers from Debian's musl-dev:arm64,
#                               musl libc from Rust's target. Uses musl's malloc (slower
#                               ingest than glibc; see the README).
#
# It installs what it needs when missing (rustup target, apt packages: run as root or with
# sudo available), builds `cargo build --release --locked --target T`, and prints where the
# binary is, its size and `file` output. Binaries land in
# ${CARGO_TARGET_DIR:-target}/T/release/edgewatch.
#
# Environment:
#   CARGO_TARGET_DIR   cargo's target dir (default: ./target)
#   EDGEWATCH_FAST=1   skip LTO and use 16 codegen units: a much faster build with a larger,
#                      slightly slower binary; for CI smoke tests, never for shipping.
#   NO_INSTALL=1       never install anything; fail instead.
#   EDGEWATCH_MAX_BYTES  size budget of a shipping (non-fast) binary; over it the script
#                      fails (default 8000000, the 8 MB budget of the aarch64 binaries; the
#                      x86-64 binary is checked only when this is set).
#   EDGEWATCH_UNWIND_TABLES=1  keep the unwind tables (.eh_frame) in the binary, for
#                      `perf --call-graph dwarf` or full panic backtraces on a device.
#
# Unwind tables: the release profile aborts on panic, so nothing unwinds, and the binary is
# stripped, so a backtrace has no names to show; the tables Rust and gcc emit by default
# would only serve profilers. The build leaves them out of edgewatch's own crates and of
# the bundled SQLite (-C force-unwind-tables=no, -fno-asynchronous-unwind-tables), which
# takes about 0.5 MB off the binary; the precompiled std keeps its own. A panic still prints
# its message and source location. These flags go to cargo as the target's RUSTFLAGS and
# CFLAGS_<target>; where RUSTFLAGS, CARGO_TARGET_<T>_RUSTFLAGS, CFLAGS or CFLAGS_<target> is
# already set in the environment, that one is left alone and applies instead.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

apt_install() {
    if [ "${NO_INSTALL:-0}" = 1 ]; then
        echo "error: missing Debian packages: $* (NO_INSTALL=1 set)" >&2
        exit 1
    fi
    echo "==> installing Debian packages: $*"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

rust_target() {
    if ! rustup target list --installed | grep -qx "$1"; then
        [ "${NO_INSTALL:-0}" = 1 ] && { echo "error: rustup target $1 missing" >&2; exit 1; }
        echo "==> rustup target add $1"
        rustup target add "$1"
    fi
}

# The static musl build compiles SQLite with Debian's aarch64 gcc against musl's headers
# (Debian's musl-dev:arm64, downloaded with a private apt state and unpacked under
# $MUSL_ARM64_ROOT: the host's dpkg architectures and package lists are left alone), and
# links with the same gcc against the musl CRT and libc.a that ship with Rust's musl target.
# Debian's mirrors carry arm64; on an Ubuntu host (arm64 lives on ports.ubuntu.com) unpack
# musl-dev for arm64 yourself (`dpkg-deb -x musl-dev_*_arm64.deb $MUSL_ARM64_ROOT/sysroot`).
MUSL_ARM64_ROOT=${MUSL_ARM64_ROOT:-$HOME/.cache/edgewatch/musl-arm64}
musl_arm64_headers() {
    local inc="$MUSL_ARM64_ROOT/sysroot/usr/include/aarch64-linux-musl"
    if [ ! -f "$inc/stdio.h" ]; then
        [ "${NO_INSTALL:-0}" = 1 ] && { echo "error: no musl arm64 headers under $MUSL_ARM64_ROOT" >&2; exit 1; }
        echo "==> fetching Debian's musl-dev:arm64 into $MUSL_ARM64_ROOT" >&2
        local r=$MUSL_ARM64_ROOT
        mkdir -p "$r/lists/partial" "$r/cache/archives/partial" "$r/dl" "$r/sysroot"
        local opts=(-o APT::Architectures::=amd64 -o APT::Architectures::=arm64
            -o "Dir::State::Lists=$r/lists" -o "Dir::Cache=$r/cache" -o Debug::NoLocking=1)
        apt-get "${opts[@]}" update -qq >&2
        (cd "$r/dl" && apt-get "${opts[@]}" download musl-dev:arm64 2>&1 | grep -v unsandboxed >&2 || true)
        dpkg-deb -x "$r"/dl/musl-dev_*_arm64.deb "$r/sysroot"
    fi
    echo "$inc"
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(aarch64-unknown-linux-gnu)

profile_env=()
if [ "${EDGEWATCH_FAST:-0}" = 1 ]; then
    profile_env=(CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16)
fi

for t in "${targets[@]}"; do
    envs=()
    tu=$(tr 'a-z-' 'A-Z_' <<<"$t")
    tl=${t//-/_}
    nounwind_c=""
    if [ "${EDGEWATCH_UNWIND_TABLES:-0}" != 1 ]; then
        rf="CARGO_TARGET_${tu}_RUSTFLAGS" cf="CFLAGS_${tl}"
        [ -n "${RUSTFLAGS:-}${!rf:-}" ] || envs+=("$rf=-C force-unwind-tables=no")
        if [ -z "${CFLAGS:-}${!cf:-}" ]; then
            nounwind_c="-fno-asynchronous-unwind-tables -fno-unwind-tables"
            envs+=("$cf=$nounwind_c")
        fi
    fi
    case "$t" in
        aarch64-unknown-linux-gnu)
            command -v aarch64-linux-gnu-gcc >/dev/null || apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
            envs+=(
                CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
                CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
                AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
            )
            ;;
        x86_64-unknown-linux-gnu)
            ;;
        aarch64-unknown-linux-musl)
            command -v aarch64-linux-gnu-gcc >/dev/null || apt_install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
            inc=$(musl_arm64_headers)
            gccinc=$(aarch64-linux-gnu-gcc -print-file-name=include)
            envs+=(
                CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
                CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
                AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
                "CFLAGS_aarch64_unknown_linux_musl=-nostdinc -isystem $inc -isystem $gccinc $nounwind_c"
            )
            ;;
        *)
            echo "error: unsupported target $t" >&2
            exit 2
            ;;
    esac
    rust_target "$t"
    echo "==> cargo build --release --locked --target $t ${profile_env[*]}"
    start=$(date +%s)
    env "${envs[@]}" "${profile_env[@]}" cargo build --release --locked --target "$t" --bin edgewatch
    bin="${CARGO_TARGET_DIR:-target}/$t/release/edgewatch"
    size=$(stat -c %s "$bin")
    echo "==> $bin: $size bytes, built in $(( $(date +%s) - start )) s"
    file "$bin" 2>/dev/null || true
    # Size budget of the shipping build (the fast build is larger and is not checked).
    case "$t" in
        aarch64-*) max_bytes=${EDGEWATCH_MAX_BYTES:-8000000} ;;
        *) max_bytes=${EDGEWATCH_MAX_BYTES:-} ;;
    esac
    if [ "${EDGEWATCH_FAST:-0}" != 1 ] && [ -n "$max_bytes" ] && [ "$size" -gt "$max_bytes" ]; then
        echo "error: $bin is $size bytes, over the $max_bytes-byte budget (EDGEWATCH_MAX_BYTES)" >&2
        exit 1
    fi
done
