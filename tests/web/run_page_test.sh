#!/usr/bin/env bash
# The web page of `kiln serve` in a real browser: headless Debian chromium
# driven by npm's playwright-core (installed here on first use, pinned).
#   run_page_test.sh KILN_BIN CHROMIUM WORK_DIR
# The screenshot is left at WORK_DIR/server_page.png (a CI artifact).
set -euo pipefail
KILN_PLAYWRIGHT_CORE=playwright-core@1.65.1
KILN_BIN="$1"
CHROMIUM="$2"
WORK="$3"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$WORK"
if [[ ! -f "$WORK/node_modules/playwright-core/package.json" ]] ||
    [[ "$(node -p "require('$WORK/node_modules/playwright-core/package.json').version")" != "${KILN_PLAYWRIGHT_CORE#*@}" ]]; then
    (cd "$WORK" && npm install --silent --no-save --no-audit --no-fund --prefix . "$KILN_PLAYWRIGHT_CORE")
fi
NODE_PATH="$WORK/node_modules" exec node "$HERE/server_page_test.cjs" "$KILN_BIN" "$CHROMIUM" "$WORK"
