#!/usr/bin/env bash
# Screenshot an HTML report with headless Chromium (apt-get install chromium), e.g. after `tlql demo`:
#   bash scripts/screenshot_report.sh results/demo/report.html docs/report_screenshot.png
set -euo pipefail
REPORT=${1:-results/demo/report.html}
SHOT=${2:-docs/report_screenshot.png}
BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome)
"$BROWSER" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1300,3000 \
  --virtual-time-budget=8000 --screenshot="$(realpath -m "$SHOT")" "file://$(realpath "$REPORT")" 2>/dev/null
echo "screenshot: $SHOT"
