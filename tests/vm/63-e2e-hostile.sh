#!/usr/bin/env bash
# A hostile host on the link (tests/hostile: it watches node A's interface, so it knows a
# live connection's addresses, ports, connection id and PSNs, and forges datagrams as if
# from node A) against tests/e2e/target.c in node B, whose registered regions are fenced
# by guard pages and canaries.  One connection per attack; the answer the hostile tool
# sees (the Terminate node B sends back, RFC 5040/5041 section 7) and the state of the
# attacked connection are checked against what the RFCs prescribe, and at the end every
# region and canary is compared byte by byte with what the target wrote.  A control Write
# within the one region open to remote writes must land: it shows the forged datagrams are
# well made, so the refusals are the checks' doing.  Meanwhile a verify.c pair on another
# connection must finish with every byte right (other connections unaffected).  Last, a
# flood of connection requests with made-up sources at a listener: urdmad's request table
# stays within its bound, the listener rejects them, a good connection gets through
# afterwards, and urdmad and the kernel are healthy.
# vm-timeout: 1200
# vm-bed: shared
set -u
. tests/e2e/lib.sh

hostile=${URDMA_HOSTILE:-target/release/urdma-hostile}
[ -x "$hostile" ] || fail "no $hostile (cargo build --release --workspace builds it)"
target=$(build_e2e target) || exit 1
verify=$(build_e2e verify) || exit 1
FLOOD=${HOSTILE_FLOOD:-3000}	# connection requests, HOSTILE_FLOOD_RATE a second
FLOOD_RATE=${HOSTILE_FLOOD_RATE:-300}

# name | attack (region names stand for their stag, addr and len) | answer | how node B's
# connection ends (alive: it still takes Sends; error: an error completion came first;
# disconnected: DISCONNECTED came first; a|b: either)
plan=(
	"control-write|write w.stag w.addr 100|none|alive"
	"unknown-stag|write 0x5eed0001 0 64|terminate layer=ddp etype=1 code=0|error"
	"invalidated-stag|write gone.stag gone.addr 64|terminate layer=ddp etype=1 code=0|error"
	"other-pd|write otherpd.stag otherpd.addr 64|terminate layer=ddp etype=1 code=2|error"
	"no-remote-rights|write local.stag local.addr 64|terminate layer=rdmap etype=1 code=2|error"
	"read-only|write ro.stag ro.addr 64|terminate layer=rdmap etype=1 code=2|error"
	"past-the-end|write w.stag w.end 1|terminate layer=ddp etype=1 code=1|error"
	"across-the-end|write w.stag w.end-10 64|terminate layer=ddp etype=1 code=1|error"
	"before-the-start|write w.stag w.addr-64 64|terminate layer=ddp etype=1 code=1|error"
	"offset-wraps|write w.stag 0xffffffffffffffe0 64|terminate layer=ddp etype=1 code=3|error"
	"read-no-rights|read local.stag local.addr 64|terminate layer=rdmap etype=1 code=2|error"
	"read-too-long|read w.stag w.addr 100000|terminate layer=rdmap etype=1 code=1|error"
	"read-unknown-stag|read 0x5eed0002 0 64|terminate layer=rdmap etype=1 code=0|error"
	"forged-ack|ack|none|alive"
	"forged-sack|sack|none|alive"
	"junk|junk 600|none|alive"
	"bad-ddp-version|malformed|terminate layer=ddp etype=2 code=6|error"
	"forged-terminate|terminate|none|error"
	"forged-fin|fin|none|error|disconnected"
)
n=${#plan[@]}

bed_up
base_a=$(res_counts urdmaA)
base_b=$(res_counts urdmaB)
info=$OUT/target.info
rm -f "$info"

# the bystanders: a verify.c pair on connections of their own, running throughout
start_server B bystander "listening" "$verify" server "$ADDR_B" 7991 -m 16384 -t 900
bpid=$SERVER_PID
ip netns exec urdmaA "$verify" client "$ADDR_B" 7991 -n 400 -m 16384 -t 900 >"$OUT/bystander-client.log" 2>&1 &
bcpid=$!

start_server B target "listening" "$target" server "$ADDR_B" 7990 "$info" -c "$n" -t 900
tpid=$SERVER_PID
ip netns exec urdmaA stdbuf -oL "$target" client "$ADDR_B" 7990 -c "$n" -t 900 >"$OUT/target-client.log" 2>&1 &
tcpid=$!
for _ in $(seq 600); do
	grep -q '^ready' "$info" 2>/dev/null && break
	kill -0 "$tpid" 2>/dev/null || fail "target server: $(tail -n1 "$OUT/target.log")"
	sleep 0.5
done
grep -q '^ready' "$info" 2>/dev/null || fail "target server: no $n connections in 300 s"
for _ in $(seq 300); do
	grep -q 'target: quiet' "$OUT/target-client.log" && break
	kill -0 "$tcpid" 2>/dev/null || fail "target client: $(tail -n1 "$OUT/target-client.log")"
	sleep 0.5
done
grep -q 'target: quiet' "$OUT/target-client.log" || fail "target client: no first Sends in 150 s"
echo "$n connections up; regions:"
grep '^region' "$info" | sed 's/^/  /'

# field NAME KEY: a region's stag, addr or len from the target's info
field() { awk -v r="$1" -v k="$2" '$1 == "region" && $2 == r { for (i = 3; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' "$info"; }
# value WORD: a number of the plan, region.stag, region.addr[+-N] and region.end[+-N] resolved
value() {
	local w=$1 r k rest
	case $w in
	*.stag | *.addr* | *.end*)
		r=${w%%.*}
		k=${w#*.}
		rest=${k#stag}
		rest=${rest#addr}
		rest=${rest#end}
		k=${k%"$rest"}
		case $k in
		stag) field "$r" stag ;;
		addr) printf '0x%x\n' "$(($(field "$r" addr) + ${rest:-0}))" ;;
		end) printf '0x%x\n' "$(($(field "$r" addr) + $(field "$r" len) + ${rest:-0}))" ;;
		esac
		;;
	*) echo "$w" ;;
	esac
}

ip_a=$ADDR_A
i=0
for row in "${plan[@]}"; do
	IFS='|' read -r name attack want state <<<"$row"
	ports=$(awk -v c="$i" '$1 == "conn" && $2 == c { print $3, $4 }' "$info")
	lport=${ports%% *}
	lport=${lport#local=}
	pport=${ports##* }
	pport=${pport#peer=}
	args=()
	for w in $attack; do args+=("$(value "$w")"); done
	got=$(ip netns exec urdmaA timeout 60 "$hostile" urdma-vethA "$ip_a:$pport" "$ADDR_B:$lport" "${args[@]}" 2>"$OUT/hostile-$name.err") ||
		fail "$name: urdma-hostile: $(tail -n1 "$OUT/hostile-$name.err")"
	[ "$got" = "answer $want" ] || fail "$name (${args[*]}): node B's answer '$got', want 'answer $want'"
	echo "  $name: ${args[*]} -> $got"
	i=$((i + 1))
done

# one more Send on every connection node A still has, then the reports: the server's first,
# since the end of either process ends the other's connections
kill -USR1 "$tcpid"
sleep 8
kill -TERM "$tpid"
SERVER_PID=$tpid
wait_server target 60
grep -q "target: server done" "$OUT/target.log" || fail "target server: no report (a fault?): $(tail -n1 "$OUT/target.log")"
kill -TERM "$tcpid"
for _ in $(seq 150); do kill -0 "$tcpid" 2>/dev/null || break; sleep 0.2; done
kill -0 "$tcpid" 2>/dev/null && fail "target client did not end on SIGTERM"
wait "$tcpid" 2>/dev/null || fail "target client: $(grep -m1 FAIL "$OUT/target-client.log" || tail -n1 "$OUT/target-client.log")"

i=0
for row in "${plan[@]}"; do
	IFS='|' read -r name attack want state <<<"$row"
	state=${state//|/ }
	srv=$(awk -v c="$i" '$1 == "conn" && $2 == c' "$OUT/target.log")
	cli=$(awk -v c="$i" '$1 == "conn" && $2 == c && $3 ~ /^sends=/' "$OUT/target-client.log")
	[[ " $state " == *" ${srv##*state=} "* ]] || fail "$name: node B's connection ended '${srv##*state=}', want '$state' ($srv)"
	if [ "$state" = alive ]; then
		sends=${cli#*sends=}
		sends=${sends%% *}
		recvs=${srv#*recvs=}
		recvs=${recvs%% *}
		# A forgery that takes a PSN (the control Write) takes the place of A's next
		# Send, which B then drops as a duplicate: A counts it, B never sees it.
		lost=0
		[ "$name" = control-write ] && lost=1
		[ "$recvs" = $((sends - lost)) ] || fail "$name: node A sent $sends, node B received $recvs"
	fi
	i=$((i + 1))
done
echo "connections: every attacked one ended as the RFCs say; the others carried on with every Send"

# memory: only the control Write's 100 bytes of w changed
while read -r kind rname rest; do
	want="changed=0 first=-1 last=-1"
	[ "$kind $rname" = "region w" ] && want="changed=100 first=0 last=99"
	[ "$rest" = "$want" ] || fail "$kind $rname: $rest, want $want"
done < <(grep -E '^(region|canary) ' "$OUT/target.log")
echo "memory: the control Write's 100 bytes placed; every other byte of every region, canary and guard page as the target wrote it"

wait "$bcpid" 2>/dev/null || fail "bystander client: $(grep -m1 FAIL "$OUT/bystander-client.log" || tail -n1 "$OUT/bystander-client.log")"
SERVER_PID=$bpid
wait_server bystander 120
echo "bystander: $(tail -n1 "$OUT/bystander-client.log")"

# the flood
mac_b=$(ip -n urdmaB link show urdma-vethB | awk '/link\/ether/ {print $2}')
upid=$(cat /run/urdma/bed/B.pid) || fail "no pid file for node B's urdmad"
rss() { awk '/^VmRSS/ {print $2}' "/proc/$upid/status"; }
start_server B listen "listening" "$target" listen "$ADDR_B" 7992 -t 900
lpid=$SERVER_PID
rss0=$(rss)
peak=0
ip netns exec urdmaA timeout 300 "$hostile" urdma-vethA flood "$ADDR_A" "$mac_b" "$ADDR_B:7992" "$FLOOD" "$FLOOD_RATE" >"$OUT/flood.log" 2>&1 &
fpid=$!
while kill -0 "$fpid" 2>/dev/null; do
	r=$("$BED" status --json B | jq -r '.cm[0].requests // empty')
	[ "${r:-0}" -gt "$peak" ] && peak=$r
	sleep 1
done
wait "$fpid" || fail "flood: $(tail -n1 "$OUT/flood.log")"
kill -0 "$upid" 2>/dev/null || fail "node B's urdmad died under the flood"
out=$(t ip netns exec urdmaA "$target" connect "$ADDR_B" 7992 -t 300 2>&1) ||
	fail "a good connection after the flood: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"
wait_server listen 300
rss1=$(rss)
cm=$("$BED" status --json B | jq -c '.cm[0]')
echo "flood: $(cat "$OUT/flood.log"); urdmad's request table at most $peak (now: $cm); its RSS ${rss0} -> ${rss1} kB; $(tail -n1 "$OUT/listen.log"); a good connection got through"
max_req=$("$BED" status --json B | jq -r '.cm[0].max_requests // empty')
[ -n "$max_req" ] && [ "$peak" -le "$max_req" ] || fail "urdmad's request table reached $peak (bound '${max_req}')"
[ $((rss1 - rss0)) -lt 16384 ] || fail "urdmad's RSS grew by $((rss1 - rss0)) kB under the flood"

wait_res urdmaA "$base_a" 60
wait_res urdmaB "$base_b" 60
dmesg_check
echo "PASS"
