# Sourced by the relay and cache benchmarks: how the sidecar's HTTP side runs.
#   METRICS=scrape [default]: /metrics on (the shipped default), scraped every
#                             SCRAPE_EVERY [1] s by a background client for the
#                             whole run (Prometheus scrapes every 15-60 s).
#   METRICS=off:              http.enabled = false.
# metrics_args PORT -> the --set arguments; start_scraper PORT; stop_scraper.
METRICS="${METRICS:-scrape}"
SCRAPE_EVERY="${SCRAPE_EVERY:-1}"
SCRAPER_PID=""
case "$METRICS" in scrape|off) ;; *) echo "METRICS must be scrape or off, got $METRICS" >&2; exit 2 ;; esac

metrics_args() {
  if [[ "$METRICS" == off ]]; then
    echo "--set http.enabled=false"
  else
    echo "--set http.listen=\"127.0.0.1:$1\""
  fi
}

start_scraper() {
  [[ "$METRICS" == scrape ]] || return 0
  "${PY:-python3}" - "$1" "$SCRAPE_EVERY" <<'PYEOF' &
import sys, time, urllib.request
port, every = int(sys.argv[1]), float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        pass
    time.sleep(every)
PYEOF
  SCRAPER_PID=$!
}

stop_scraper() {
  if [[ -n "$SCRAPER_PID" ]]; then
    kill "$SCRAPER_PID" 2>/dev/null || true
    wait "$SCRAPER_PID" 2>/dev/null || true
    SCRAPER_PID=""
  fi
}
