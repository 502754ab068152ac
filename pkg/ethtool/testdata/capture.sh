#!/usr/bin/env bash
# Regenerates rxnfc/*.hex: the struct ethtool_rxnfc that Debian 12's
# ethtool 6.1 passes to SIOCETHTOOL/ETHTOOL_SRXCLSRLINS for each rule of
# rules.txt, and rxfh/*.hex: the struct ethtool_rxfh of ETHTOOL_SRSSH for
# each RSS context command of rss.txt. No virtual device accepts either, so
# a shim on ioctl() (capture_shim.c) records the struct; the kernel (or the
# shim) then refuses it on a veth. ethtool leaves `data` and the padding of
# rxnfc uninitialised: tests skip them.
# Run as root from this directory: ./capture.sh
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'ip link del xdpqcap0 2>/dev/null || true; rm -rf "$tmp"' EXIT
gcc -shared -fPIC -o "$tmp/shim.so" capture_shim.c -ldl
ip link add xdpqcap0 type veth peer name xdpqcap1
while IFS=$'\t' read -r name args; do
  XDPQ_CAPTURE="rxnfc/$name.hex" LD_PRELOAD="$tmp/shim.so" ethtool -N xdpqcap0 $args 2>/dev/null || true
  test -s "rxnfc/$name.hex" || { echo "no capture for $name" >&2; exit 1; }
done < rules.txt
mkdir -p rxfh
while IFS=$'\t' read -r name args; do
  XDPQ_CAPTURE="rxfh/$name.hex" LD_PRELOAD="$tmp/shim.so" ethtool -X xdpqcap0 $args 2>/dev/null || true
  test -s "rxfh/$name.hex" || { echo "no capture for $name" >&2; exit 1; }
done < rss.txt
echo "captured $(cat rules.txt rss.txt | wc -l) commands with $(ethtool --version)"
