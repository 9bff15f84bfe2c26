#!/bin/sh
# A stand-in for NVIDIA's tegrastats in edgewatch's tests (tests/tegrastats.rs).
#   FAKE_TEGRASTATS_STARTS  file that gets one line "PID ARGS..." per start
#   FAKE_TEGRASTATS_LOG     tegrastats lines to print, one every 50 ms (required)
#   FAKE_TEGRASTATS_MODE    "exit" (default): exit with status 3 after the lines;
#                           "hang": sleep FAKE_TEGRASTATS_SLEEP seconds after them;
#                           "close": close stdout, then sleep like "hang"
#   FAKE_TEGRASTATS_SLEEP   default 3600; a test passes a unique value to find the sleep
set -u
if [ -n "${FAKE_TEGRASTATS_STARTS:-}" ]; then
  echo "$$ $*" >> "$FAKE_TEGRASTATS_STARTS"
fi
echo "fake tegrastats: started with $*" >&2
while IFS= read -r line || [ -n "$line" ]; do
  printf '%s\n' "$line"
  sleep 0.05
done < "${FAKE_TEGRASTATS_LOG:?}"
case "${FAKE_TEGRASTATS_MODE:-exit}" in
  hang) sleep "${FAKE_TEGRASTATS_SLEEP:-3600}" ;;
  close) exec >&-; sleep "${FAKE_TEGRASTATS_SLEEP:-3600}" ;;
  *) echo "fake tegrastats: exiting" >&2; exit 3 ;;
esac
