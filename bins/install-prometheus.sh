#!/usr/bin/env bash
# Install Prometheus and promtool from Debian (tests/integration/test_prometheus.py needs both).
#
#   bins/install-prometheus.sh     as root, on Debian/Ubuntu; does nothing if both are installed
#
# The tests start their own Prometheus on a free port, so a server the package's postinst may have
# started (it does where services may start, e.g. no policy-rc.d) is stopped again here.
set -euo pipefail

PROMETHEUS=/usr/bin/prometheus
PROMTOOL=/usr/bin/promtool

say() { echo "install-prometheus: $*"; }
die() { echo "install-prometheus: $*" >&2; exit 1; }

if [[ -x "$PROMETHEUS" && -x "$PROMTOOL" ]]; then
  say "$PROMETHEUS and $PROMTOOL already installed; nothing to do"
  "$PROMTOOL" --version | head -n1
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "needs root for apt-get (try: sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "no apt-get; install the 'prometheus' package (server and promtool) by hand"

# PIDs of running /usr/bin/prometheus processes, one per line.
prometheus_pids() {
  local dir
  for dir in /proc/[0-9]*; do
    [[ "$(readlink "$dir/exe" 2>/dev/null)" == "$PROMETHEUS" ]] && echo "${dir#/proc/}"
  done
  return 0
}

before="$(prometheus_pids)"
if [[ -n "$before" ]]; then
  say "already running before the install (left alone): PIDs $(echo $before)"
fi

say "apt-get update"
apt-get update -qq
say "apt-get install -y --no-install-recommends prometheus"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus

# Whatever the postinst started is new; stop exactly those PIDs.
started=()
for pid in $(prometheus_pids); do
  grep -qx "$pid" <<<"$before" || started+=("$pid")
done
if ((${#started[@]} == 0)); then
  say "the package left no Prometheus server running"
else
  say "the package started a Prometheus server: PIDs ${started[*]}; stopping it"
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable --now prometheus.service || true
  fi
  for pid in "${started[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    alive=()
    for pid in "${started[@]}"; do
      [[ -d "/proc/$pid" ]] && alive+=("$pid")
    done
    ((${#alive[@]} == 0)) && break
    sleep 0.2
  done
  for pid in "${alive[@]}"; do
    say "PID $pid ignored SIGTERM; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  done
  say "stopped"
fi

[[ -x "$PROMETHEUS" && -x "$PROMTOOL" ]] || die "the package did not install $PROMETHEUS and $PROMTOOL"
"$PROMTOOL" --version | head -n1
