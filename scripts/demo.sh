#!/bin/sh
# make demo: a console on fresh data in .demo/ with one local agent enrolled
# and running. Ctrl-C stops both.
set -eu
cd "$(dirname "$0")/.."
DEMO=$PWD/.demo
ADDR=${EDGEBOX_DEMO_ADDR:-127.0.0.1:8443}
URL=https://$ADDR
rm -rf "$DEMO"
mkdir -p "$DEMO"
export EDGEBOX_CONFIG=$DEMO/cli.json

pids=""
stop() {
	trap - INT TERM EXIT
	echo
	echo "demo: stopping"
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	for p in $pids; do wait "$p" 2>/dev/null || true; done
	# Native workloads outlive their agent, as on a real box; the demo's
	# do not outlive the demo.
	for run in "$DEMO"/agent/process/*/run.json; do
		[ -f "$run" ] || continue
		pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$run")
		[ -n "$pid" ] && kill -TERM "-$pid" 2>/dev/null || true
	done
	echo "demo: stopped (data kept in .demo/)"
}
trap stop INT TERM EXIT

echo "demo: starting the console on $URL (data in .demo/console, log in .demo/console.log)"
bin/edgebox-console --data "$DEMO/console" --listen "$ADDR" --public-url "$URL" >"$DEMO/console.out" 2>"$DEMO/console.log" &
pids="$!"
i=0
until grep -q 'admin token' "$DEMO/console.out" 2>/dev/null; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 "$pids" 2>/dev/null; then
		echo "demo: the console did not start:"; cat "$DEMO/console.log"; exit 1
	fi
	sleep 0.1
done
TOKEN=$(awk '/admin token:/ {print $3}' "$DEMO/console.out")
CAHASH=$(awk '/CA sha256:/ {print $3}' "$DEMO/console.out")
PASSWORD=$(awk '/^  password:/ {print $2}' "$DEMO/console.out")

bin/edgebox login "$URL" --token "$TOKEN" --ca-sha256 "$CAHASH"
ENROLL=$(bin/edgebox token create --region demo --site local -o json | sed -n 's/.*"token": "\(ebx1[^"]*\)".*/\1/p')
bin/edgebox-agent enroll --data "$DEMO/agent" --name demo-box "$ENROLL"
# Two simulated bank keys on a hub that can switch its ports' power.
cat >"$DEMO/usb-sim.json" <<'SIM'
{"hubs": [{"port": "1-1", "switchable": true}],
 "keys": [{"port": "1-1.1", "vendor_id": "096e", "product_id": "0702", "serial": "ICBC0001", "manufacturer": "Feitian", "product": "ICBC U-Key", "class": "smartcard"},
          {"port": "1-1.2", "vendor_id": "096e", "product_id": "0702", "serial": "ICBC0002", "manufacturer": "Feitian", "product": "ICBC U-Key", "class": "smartcard"}]}
SIM
echo "demo: starting the agent with two simulated USB keys (log in .demo/agent.log)"
bin/edgebox-agent run --data "$DEMO/agent" --usb-sim "$DEMO/usb-sim.json" 2>"$DEMO/agent.log" &
pids="$pids $!"
i=0
until bin/edgebox boxes ls 2>/dev/null | grep -q ' yes'; do
	i=$((i + 1))
	[ $i -le 100 ] || { echo "demo: the box did not come online:"; cat "$DEMO/agent.log"; exit 1; }
	sleep 0.1
done
bin/edgebox boxes ls
cat <<MSG

The console and one box are up. In another shell, try:

  export EDGEBOX_CONFIG=$DEMO/cli.json
  bin/edgebox boxes ls                      # the box, online
  bin/edgebox boxes label demo-box bank=icbc
  bin/edgebox token create --region east --site shop-12 --approve
  bin/edgebox-agent status --data $DEMO/agent
  bin/edgebox boxes desired put demo-box Workload/clock --spec '{"app":"clock","runtime":"process","image":"/bin/sh","args":["-c","while :; do date; for k in $DEMO/agent/usb-sim/*/*; do [ -e \$k ] && (exec 3<>\$k) 2>/dev/null && echo holds key \$k; done; sleep 5; done"]}'
  bin/edgebox boxes state demo-box          # desired objects, what the box stored, its status
  bin/edgebox logs demo-box clock           # its output, fetched from the box through the tunnel
  bin/edgebox keys ls                       # the two simulated ICBC keys
  bin/edgebox keys label KEY bank=icbc && bin/edgebox keys lease KEY --workload clock
  bin/edgebox logs demo-box clock           # the clock now holds the key: its node, in $DEMO/agent/usb-sim
  bin/edgebox keys history KEY              # who held the key, when
  bin/edgebox audit ls
  bin/edgebox user create alice --role viewer   # asks for her password

Admin user: admin, password $PASSWORD; admin token: $TOKEN   (also in $DEMO/console.out)
Press Ctrl-C to stop.
MSG
wait
