#!/usr/bin/env bash
# scripts/package makes the three Debian packages, each what it says: the provider named for
# the provider ABI of the libibverbs it was built against and carrying nothing of the daemon,
# the daemon with its unit, conffile, group and modules, and a DKMS source tree that builds
# urdma.ko for the VM's kernel as DKMS would. (Installing them into a Debian booted with
# systemd is tests/deploy's part.) lintian finds nothing to say about them, and urdmad's
# manual page documents the options its --help lists.
#   bash tests/host/package.sh
set -u

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
suite=package
. tests/host/checks.sh

if ! scripts/package --no-build --out "$out/debs" >"$out/package.log" 2>&1; then
	cat "$out/package.log"
	echo "package: FAIL scripts/package"
	exit 1
fi
version=$(awk -F'"' '/^version *=/ {print $2; exit}' urdmad/Cargo.toml)
provider=$(ls "$out"/debs/urdma-provider_"$version"-1_*.deb 2>/dev/null)
daemon=$(ls "$out"/debs/urdmad_"$version"-1_*.deb 2>/dev/null)
dkms=$(ls "$out"/debs/urdma-dkms_"$version"-1_all.deb 2>/dev/null)
check "three packages" test -f "$provider" -a -f "$daemon" -a -f "$dkms"

files() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's|^\./|/|'; }
field() { dpkg-deb -f "$1" "$2"; }
has() { files "$1" | grep -qx "$2"; }

# The provider: named for the installed libibverbs' provider ABI (the one it was built for).
pabi=$(objdump -T "$(ldconfig -p | awk '$1 == "libibverbs.so.1" {print $NF; exit}')" |
	grep -o 'IBVERBS_PRIVATE_[0-9]*' | sort -V | tail -n1)
pabi=${pabi#IBVERBS_PRIVATE_}
triplet=$(gcc -dumpmachine)
check "provider at /usr/lib/$triplet/libibverbs/liburdma-rdmav$pabi.so" \
	has "$provider" "/usr/lib/$triplet/libibverbs/liburdma-rdmav$pabi.so"
check "provider's .driver file, a conffile" bash -c "dpkg-deb -c '$provider' | grep ' ./etc/libibverbs.d/urdma.driver$' >/dev/null &&
	dpkg-deb --ctrl-tarfile '$provider' | tar -xO ./conffiles | grep -x /etc/libibverbs.d/urdma.driver >/dev/null"
check "provider carries nothing of the daemon" \
	bash -c "! dpkg-deb -c '$provider' | grep -iE 'urdmad|systemd|sysusers' >/dev/null"
check "provider depends on libibverbs1" bash -c "dpkg-deb -f '$provider' Depends | grep -q 'libibverbs1 (>= '"
mkdir -p "$out/p"
dpkg-deb -x "$provider" "$out/p"
check "provider library loads its symbols from libibverbs" \
	bash -c "objdump -T '$out/p/usr/lib/$triplet/libibverbs/liburdma-rdmav$pabi.so' | grep 'IBVERBS_PRIVATE_$pabi' >/dev/null"

# The daemon.
for f in /usr/sbin/urdmad /lib/systemd/system/urdmad.service /etc/urdma/urdmad.toml \
	/usr/lib/sysusers.d/urdma.conf /usr/lib/modules-load.d/urdma.conf; do
	check "urdmad has $f" has "$daemon" "$f"
done
check "urdmad's configuration is a conffile" \
	bash -c "dpkg-deb --ctrl-tarfile '$daemon' | tar -xO ./conffiles | grep -x /etc/urdma/urdmad.toml >/dev/null"
check "urdmad depends on DPDK's EAL and the TAP PMD" \
	bash -c "dpkg-deb -f '$daemon' Depends | grep -q 'librte-eal23 (>= ' && dpkg-deb -f '$daemon' Depends | grep -q librte-net-tap23"
mkdir -p "$out/d"
dpkg-deb -x "$daemon" "$out/d"
check "the packaged urdmad accepts the packaged configuration" \
	"$out/d/usr/sbin/urdmad" --config "$out/d/etc/urdma/urdmad.toml" --check-config
check "the unit runs the packaged paths" \
	grep -qx "ExecStart=/usr/sbin/urdmad --config /etc/urdma/urdmad.toml" "$out/d/lib/systemd/system/urdmad.service"
check "sysusers makes the urdma group" grep -qx "g urdma -" "$out/d/usr/lib/sysusers.d/urdma.conf"
check "modules-load.d loads urdma" grep -qx urdma "$out/d/usr/lib/modules-load.d/urdma.conf"
check "urdmad has its manual page" has "$daemon" /usr/share/man/man8/urdmad.8.gz
check "the postinst makes the urdma group" \
	bash -c "dpkg-deb --ctrl-tarfile '$daemon' | tar -xO ./postinst | grep -q 'systemd-sysusers.* urdma.conf'"

# The manual page and --help name the same long options, for the daemon and for status.
options() { grep -o -- '--[a-z][a-z-]*' | sort -u; }
man_options=$(zcat "$out/d/usr/share/man/man8/urdmad.8.gz" | sed 's/\\-/-/g' | options)
help_options=$({ "$out/d/usr/sbin/urdmad" --help && "$out/d/usr/sbin/urdmad" status --help; } | options)
check "the manual page documents every option of --help" \
	test -n "$help_options" -a "$man_options" = "$help_options"
[ "$man_options" = "$help_options" ] ||
	diff <(echo "$man_options") <(echo "$help_options") | sed 's/^/package:   (man < > help) /'

# lintian: no error and no warning (overrides in debian/*.lintian-overrides, each with its
# reason). Run as root, it says so on stderr; only its tags count.
lintian --tag-display-limit 0 --fail-on error,warning "$provider" "$daemon" "$dkms" >"$out/lintian.log" 2>&1
lintian_rc=$?
check "lintian reports no error and no warning" \
	test "$lintian_rc" = 0 -a -z "$(grep -E '^[EW]: ' "$out/lintian.log")"
grep -E '^[EWI]: ' "$out/lintian.log" | sed 's/^/package:   lintian: /'

# The DKMS tree builds urdma.ko as dkms.conf says, for the VM's kernel.
mkdir -p "$out/k"
dpkg-deb -x "$dkms" "$out/k"
src=$out/k/usr/src/urdma-$version
check "dkms.conf names urdma $version" \
	bash -c "grep -qx 'PACKAGE_NAME=\"urdma\"' '$src/dkms.conf' && grep -qx 'PACKAGE_VERSION=\"$version\"' '$src/dkms.conf'"
check "the DKMS tree ships no tests" test ! -e "$src/tests"
kver=$(for d in /lib/modules/6.1*-amd64; do [ -d "$d/build" ] && basename "$d"; done | sort -V | tail -n1)
if [ -n "$kver" ]; then
	# dkms runs MAKE[0] with these two set, in the copy it makes of the tree.
	make_line=$(sed -n 's/^MAKE\[0\]="\(.*\)"$/\1/p' "$src/dkms.conf")
	mkdir -p "$out/dkms/urdma/$version"
	cp -r "$src" "$out/dkms/urdma/$version/build"
	kernel_source_dir=/lib/modules/$kver/build dkms_tree=$out/dkms PACKAGE_NAME=urdma PACKAGE_VERSION=$version \
		bash -c "eval \"$make_line\"" >"$out/dkms.log" 2>&1
	check "DKMS's make builds urdma.ko for $kver" test -f "$out/dkms/urdma/$version/build/urdma.ko"
	check "urdma.ko declares its rdma link alias" \
		bash -c "modinfo '$out/dkms/urdma/$version/build/urdma.ko' | grep -q 'alias: *rdma-link-urdma'"
else
	echo "package: FAIL no 6.1 kernel headers to build the DKMS tree against (scripts/setup installs them)"
	failed=$((failed + 1))
fi

summary
