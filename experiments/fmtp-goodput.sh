#!/usr/bin/env bash
# FMTP goodput over a namespace bridge vs iperf3 -u on the same path (issue #3 benchmark).
# Usage (root): experiments/fmtp-goodput.sh [RECEIVERS] [LOSS_PERCENT] [RATE_MBIT] [PRODUCTS]
# Builds a lab (publisher + RECEIVERS on one bridge, publisher HTB at RATE, LOSS on every
# receiver), measures iperf3 -u at full speed to the first receiver (goodput at the receiver),
# then multicasts PRODUCTS products of 10 MB with `ldm7 fmtp send --rate RATE` and reports the
# sender's goodput (product bytes / time until every product is released) and the ratio.
# FMTP_ARGS: more arguments for both `fmtp send` and `fmtp recv` (e.g. "--parity off").
# FAMILY=ipv6: the lab's hosts have IPv6 addresses only; FMTP multicasts to ff3e::8000:1 and
# repairs over TCPv6, and the baseline is `iperf3 -u -6` on the same path.
set -uo pipefail
receivers=${1:-1}; loss=${2:-0}; rate=${3:-500}; products=${4:-30}; family=${FAMILY:-ipv4}
cd "$(dirname "$0")/.."
ldm7=${LDM7:-target/release/ldm7}
[ -x "$ldm7" ] || cargo build --release --bin ldm7
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 1; }
name="gp$$"; work=$(mktemp -d)
trap '"$ldm7" lab down --name "$name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
{
  echo "name = \"$name\""
  echo "family = \"$family\""
  echo '[[hosts]]'; echo 'name = "pub"'
  subs=""
  for i in $(seq 1 "$receivers"); do
    echo '[[hosts]]'; echo "name = \"r$i\""
    [ "$loss" != 0 ] && echo "loss_percent = $loss"
    subs="$subs\"r$i\","
  done
  echo '[[feeds]]'; echo 'name = "feed"'; echo 'publisher = "pub"'
  echo "subscribers = [${subs%,}]"; echo "rate = \"$rate Mbit/s\""; echo 'buffer = "20 MB"'
} > "$work/lab.toml"
"$ldm7" lab up --spec "$work/lab.toml" >/dev/null
if [ "$family" = ipv6 ]; then
  addr() { "$ldm7" lab exec "$1" --name "$name" -- ip -6 -o addr show dev feed scope global | awk '{print $4}' | cut -d/ -f1; }
  group="[ff3e::8000:1]:38800"; v6="-6"
  endpoint() { echo "[$1]:$2"; }
else
  addr() { "$ldm7" lab exec "$1" --name "$name" -- ip -4 -o addr show dev feed | awk '{print $4}' | cut -d/ -f1; }
  group="239.255.90.1:38800"; v6=""
  endpoint() { echo "$1:$2"; }
fi
pub=$(addr pub); r1=$(addr r1)
# Baseline: iperf3 UDP at full speed (offered 2x the rate), goodput as received by r1.
"$ldm7" lab exec r1 --name "$name" -- iperf3 -s -1 -D -p 5201 >/dev/null; sleep 0.5
iperf=$("$ldm7" lab exec pub --name "$name" -- iperf3 $v6 -u -c "$r1" -p 5201 -b "$((rate * 2))M" -l 1448 -t 5 -J |
  python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["end"]["sum"]["bytes"]*8*(1-j["end"]["sum"]["lost_percent"]/100)/j["end"]["sum"]["seconds"]/1e6)')
mkdir -p "$work/products"
for i in $(seq 1 "$products"); do head -c 10000000 /dev/urandom > "$work/products/p$i"; done
"$ldm7" lab exec pub --name "$name" -- "$ldm7" fmtp send --group "$group" --iface "$pub" \
  --retx-listen "$(endpoint "$pub" 38801)" --rate "${rate}M" --receivers "$receivers" --linger 60 ${FMTP_ARGS:-} "$work"/products/* > "$work/send.txt" 2>&1 &
sleep 1
for i in $(seq 1 "$receivers"); do
  a=$(addr "r$i")
  "$ldm7" lab exec "r$i" --name "$name" -- "$ldm7" fmtp recv --group "$group" --iface "$a" \
    --sender "$(endpoint "$pub" 38801)" --count "$products" --timeout 60 --rate "${rate}M" ${FMTP_ARGS:-} > "$work/recv$i.txt" 2>&1 &
done
wait; sleep 0
fmtp=$(sed -n 's/.*(\([0-9.]*\) Mbit\/s goodput).*/\1/p' "$work/send.txt")
cat "$work"/send.txt "$work"/recv*.txt
echo "family=$family receivers=$receivers loss=${loss}% rate=${rate}Mbit/s iperf3_udp_goodput=${iperf}Mbit/s fmtp_goodput=${fmtp}Mbit/s ratio=$(python3 -c "print(round($fmtp/$iperf,3))")"
