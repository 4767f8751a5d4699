#!/usr/bin/env bash
# Install Prometheus and promtool, or Alertmanager and amtool, from Debian (tests/integration/test_prometheus.py
# needs the first two, tests/integration/test_alerting.py all four).
#
#   bins/install-prometheus.sh                as root, on Debian/Ubuntu: the package prometheus
#   bins/install-prometheus.sh alertmanager   the package prometheus-alertmanager
#
# Does nothing if the package's programs are installed. The tests start their own servers on free ports, so
# a server the package's postinst may have started (it does where services may start, e.g. no policy-rc.d)
# is stopped again here.
set -euo pipefail

case "${1:-prometheus}" in
  prometheus) PACKAGE=prometheus; SERVER=/usr/bin/prometheus; TOOL=/usr/bin/promtool; UNIT=prometheus.service ;;
  alertmanager) PACKAGE=prometheus-alertmanager; SERVER=/usr/bin/prometheus-alertmanager; TOOL=/usr/bin/amtool
                UNIT=prometheus-alertmanager.service ;;
  *) echo "usage: $0 [prometheus|alertmanager]" >&2; exit 2 ;;
esac

say() { echo "install-prometheus: $*"; }
die() { echo "install-prometheus: $*" >&2; exit 1; }

if [[ -x "$SERVER" && -x "$TOOL" ]]; then
  say "$SERVER and $TOOL already installed; nothing to do"
  "$TOOL" --version 2>&1 | head -n1
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "needs root for apt-get (try: sudo $0 $*)"
command -v apt-get >/dev/null 2>&1 || die "no apt-get; install the '$PACKAGE' package ($SERVER, $TOOL) by hand"

# PIDs of running $SERVER processes, one per line.
server_pids() {
  local dir
  for dir in /proc/[0-9]*; do
    [[ "$(readlink "$dir/exe" 2>/dev/null)" == "$SERVER" ]] && echo "${dir#/proc/}"
  done
  return 0
}

before="$(server_pids)"
if [[ -n "$before" ]]; then
  say "already running before the install (left alone): PIDs $(echo $before)"
fi

say "apt-get update"
apt-get update -qq
say "apt-get install -y --no-install-recommends $PACKAGE"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$PACKAGE"

# Whatever the postinst started is new; stop exactly those PIDs.
started=()
for pid in $(server_pids); do
  grep -qx "$pid" <<<"$before" || started+=("$pid")
done
if ((${#started[@]} == 0)); then
  say "the package left no $SERVER running"
else
  say "the package started $SERVER: PIDs ${started[*]}; stopping it"
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable --now "$UNIT" || true
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

[[ -x "$SERVER" && -x "$TOOL" ]] || die "the package did not install $SERVER and $TOOL"
"$TOOL" --version 2>&1 | head -n1
