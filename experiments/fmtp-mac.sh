#!/usr/bin/env bash
# FMTP goodput at each MAC level on loopback, levels in turn (issue #16/#37 benchmark).
# Usage: experiments/fmtp-mac.sh [ROUNDS] [CASES...]
# A case is LEVEL or LEVEL:SIGNING (2:lists, the default at level 2; 2:datagram, the
# reference's signature on each datagram). Default cases: 1 2:lists 2:datagram.
# Each run: 100 files of 2 MB of random bytes, one receiver (started 0.3 s before the sender),
# `--rate 1G`; prints the sender's multicast goodput, the wall time from the receiver's start
# to both processes' exit, each process's CPU time (user + system), and the blocks repaired.
# No root needed.
set -uo pipefail
rounds=${1:-3}; shift || true
cases=("$@"); [ ${#cases[@]} -gt 0 ] || cases=(1 2:lists 2:datagram)
cd "$(dirname "$0")/.."
ldm7=${LDM7:-target/release/ldm7}
[ -x "$ldm7" ] || cargo build --release --bin ldm7
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/p"
for i in $(seq -w 1 100); do head -c 2000000 /dev/urandom > "$work/p/p$i"; done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
for round in $(seq 1 "$rounds"); do
  for case in "${cases[@]}"; do
    level=${case%%:*}; signing=lists; [ "$case" != "$level" ] && signing=${case#*:}
    group="239.255.91.1:$(port)"; retx="127.0.0.1:$(port)"
    start=$(date +%s.%N)
    /usr/bin/time -f '%U %S' -o "$work/recv.cpu" "$ldm7" fmtp recv --group "$group" --sender "$retx" --count 100 --rate 1G --mac-level "$level" \
      > "$work/recv.txt" 2>&1 &
    recv=$!
    sleep 0.3
    /usr/bin/time -f '%U %S' -o "$work/send.cpu" "$ldm7" fmtp send --group "$group" --retx-listen "$retx" --receivers 1 --rate 1G --mac-level "$level" \
      --mac-signing "$signing" "$work"/p/p* > "$work/send.txt" 2>&1
    wait "$recv"
    end=$(date +%s.%N)
    goodput=$(sed -n 's/.*(\([0-9.]*\) Mbit\/s goodput).*/\1/p' "$work/send.txt" | tail -1)
    repaired=$(grep -o '[0-9,]* blocks retransmitted' "$work/recv.txt" | tail -1)
    [ -n "${SHOW:-}" ] && { tail -n 4 "$work/recv.txt"; tail -n 4 "$work/send.txt"; }
    cpu() { awk '{printf "%.2f", $1 + $2}' "$1"; }
    printf 'round=%s level=%s signing=%s goodput=%sMbit/s wall=%.2fs cpu_send=%ss cpu_recv=%ss %s\n' "$round" \
      "$level" "$signing" "$goodput" "$(echo "$end - $start" | bc)" "$(cpu "$work/send.cpu")" "$(cpu "$work/recv.cpu")" \
      "${repaired:-}"
  done
done
