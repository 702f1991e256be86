"""Screenshots of pages of a running MLflow UI as a person sees them, through headless Chromium's DevTools
protocol over a pipe (no package beyond Python's own): each page is loaded, MLflow's assistant panel closed,
a run's description expanded ("Show more"), charts waited for until none is loading, then captured.

    python scripts/screenshot_mlflow_ui.py OUT_DIR NAME=URL[@HEIGHT] ...

A NAME ending in -as-opened is captured without expanding anything: the page as it opens.
Prints one line per picture, `PATH  <- URL`, and writes beside it what the page's first screen shows (its visible
text, not what a collapsed box hides), so that a test can check it without looking.
Used by scripts/screenshot-mlflow-ui.sh.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

WIDTH = 1600
AS_OPENED = "-as-opened"  # a picture NAME-as-opened is taken without clicking "Show more"
SETTLE_S = 60  # how long a page may take to load its data and draw its charts

# Run in the page: close the assistant, expand descriptions, report whether anything is still loading.
PREPARE = """((EXPAND) => {
  for (const b of document.querySelectorAll('button[aria-label=Close]')) {
    let box = b;
    for (let up = 0; up < 6 && box.parentElement; up++) box = box.parentElement;
    const id = b.getAttribute('data-component-id') || '';
    if (id === 'mlflow.assistant.chat_panel.close' || (box.innerText || '').includes('MLflow Assistant')) b.click();
  }
  for (const b of EXPAND ? [...document.querySelectorAll('button, a, span[role=button]')] : []) {
    if (/^\\s*(Show|See) more\\s*$/i.test(b.innerText || '')) b.click();
  }
  const spinners = document.querySelectorAll(
    '[class*=spin], [role=progressbar], [aria-busy=true], [data-testid*=loading], [class*=keleton]');
  const visible = [...spinners].filter(e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0
    && r.top < window.innerHeight; });
  return JSON.stringify({loading: visible.length, ready: document.readyState,
    assistant: document.body.innerText.includes('Ask questions about your experiments')});
})"""


class Chromium:
    """A headless Chromium driven over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, binary: str) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--remote-debugging-pipe"]
        shell = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self.process = subprocess.Popen(
            ["bash", "-c", shell, binary, *args, "about:blank"],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id, self._buffer = 0, b""

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._next_id += 1
        message = {
            "id": self._next_id,
            "method": method,
            "params": params,
            **({"sessionId": session} if session else {}),
        }
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except RuntimeError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def shoot(browser: Chromium, url: str, path: Path, height: int, expand: bool = True) -> str:
    """Load `url` at WIDTH x height, prepare it (PREPARE: `expand` clicks "Show more") until nothing is loading,
    save a PNG; returns the text of the first screen."""
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    browser.call(
        "Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=height, deviceScaleFactor=1, mobile=False
    )
    browser.call("Page.enable", session)
    browser.call("Page.navigate", session, url=url)
    deadline, quiet_since = time.monotonic() + SETTLE_S, None
    while time.monotonic() < deadline:
        time.sleep(1)
        state = json.loads(
            browser.call(
                "Runtime.evaluate", session, expression=f"{PREPARE}({str(expand).lower()})", returnByValue=True
            )["result"]["value"]
        )
        settled = state["ready"] == "complete" and not state["loading"] and not state["assistant"]
        quiet_since = (quiet_since or time.monotonic()) if settled else None
        if quiet_since and time.monotonic() - quiet_since >= 3:  # three quiet seconds: drawn
            break
    data = browser.call("Page.captureScreenshot", session, format="png")["data"]
    path.write_bytes(base64.b64decode(data))
    text = browser.call("Runtime.evaluate", session, expression=FIRST_SCREEN, returnByValue=True)["result"]["value"]
    browser.call("Target.closeTarget", targetId=target)
    return text


# The text the page's first screen shows, in reading order: each text's own box on the screen and not hidden by an
# ancestor that clips its overflow (a collapsed description keeps its rows in the page, below its visible lines).
FIRST_SCREEN = """(() => {
  const hidden = (element, top, bottom) => {
    for (let a = element; a && a !== document.body; a = a.parentElement) {
      const style = getComputedStyle(a);
      if (style.display === 'none' || style.visibility === 'hidden' || style.opacity === '0') return true;
      if (/hidden|clip|auto|scroll/.test(style.overflowY)) {
        const box = a.getBoundingClientRect();
        if (top < box.top - 1 || bottom > box.bottom + 1) return true;  // cut, or wholly hidden
      }
    }
    return false;
  };
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, text = node.textContent.trim();
    if (!text || !node.parentElement) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const r = range.getBoundingClientRect();
    if (!(r.width > 0 && r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight)) continue;
    if (!hidden(node.parentElement, r.top, r.bottom)) out.push(text);
  }
  return out.join(' | ');
})()"""


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: screenshot_mlflow_ui.py OUT_DIR NAME=URL[@HEIGHT] ...", file=sys.stderr)
        return 2
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if binary is None:
        print("error: no chromium on PATH (apt-get install -y chromium)", file=sys.stderr)
        return 1
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    browser = Chromium(binary)
    try:
        for spec in argv[1:]:
            name, _, url = spec.partition("=")
            url, _, height = url.rpartition("@") if "@" in url.rsplit("/", 1)[-1] else (url, "", "1000")
            path = out / f"{name}.png"
            text = shoot(browser, url, path, int(height), expand=not name.endswith(AS_OPENED))
            print(f"{path}  <- {url}")
            (out / f"{name}.txt").write_text(text + "\n")
    finally:
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
