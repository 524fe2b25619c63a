"""The README's screenshot of the chat page: `mtp-cli serve` (the demo model unless -m is given) on a
free port, Chromium (headless, through selenium) asking one question, the page saved as a PNG.

    python scripts/webui_screenshot.py docs/webui.png [-m MODEL] [-q QUESTION]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("-m", "--model")
    ap.add_argument("-q", "--question", default="Give me three tips for writing clear emails.")
    args = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cmd = [sys.executable, "-m", "mtp_cli", "serve", "--port", "0", *(["-m", args.model] if args.model else [])]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = ""
        while "serving" not in line:
            line = server.stderr.readline()
            if not line:
                raise SystemExit("the server did not start")
        base = re.search(r"chat page at (\S+)", line).group(1)  # type: ignore[union-attr]
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium") or ""
        for a in ("--headless=new", "--no-sandbox", "--window-size=1000,640", "--disable-dev-shm-usage"):
            opts.add_argument(a)
        browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
        try:
            from urllib.parse import quote

            browser.get(f"{base}?q={quote(args.question)}")
            WebDriverWait(browser, 120).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".turn.assistant.done"))
            browser.save_screenshot(args.out)
        finally:
            browser.quit()
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
