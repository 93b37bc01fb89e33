"""Browser tests' tools: the real app on uvicorn in a thread, Debian's Chromium driven by
Playwright (never a downloaded browser), page watchers, and the in-page checks for headings,
contrast and focus."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]


def chromium_path() -> tuple[str | None, str]:
    """The Chromium to drive (GATE_TEST_CHROMIUM, else Debian's), or None and why not."""
    wanted = os.environ.get("GATE_TEST_CHROMIUM") or "/usr/bin/chromium"
    found = shutil.which(wanted) if not os.path.isabs(wanted) else wanted
    if not found or not os.access(found, os.X_OK):
        return None, f"no executable Chromium at {wanted} (set GATE_TEST_CHROMIUM)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return None, f"the playwright package is not installed ({exc})"
    return found, ""


def artifacts_dir() -> Path:
    """Where screenshots go: GATE_TEST_ARTIFACTS, else .gate/test-artifacts/ in the repo."""
    out = Path(os.environ.get("GATE_TEST_ARTIFACTS") or REPO / ".gate" / "test-artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    server: uvicorn.Server
    thread: threading.Thread


@contextmanager
def serve(app: Any) -> Iterator[Server]:
    """The app on a real socket (uvicorn in a background thread) until the block ends."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield Server(f"http://127.0.0.1:{port}", server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextmanager
def chromium(executable: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watch:
    """Everything a page complained about: console errors, uncaught errors, dialogs."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> Watch:
        page.on(
            "console",
            lambda m: self.console_errors.append(m.text) if m.type == "error" else None,
        )
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))

        def on_dialog(d: Any) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        return self

    def assert_clean(self) -> None:
        assert self.console_errors == [], self.console_errors
        assert self.page_errors == [], self.page_errors
        assert self.dialogs == [], self.dialogs


HEADINGS_JS = """() => [...document.querySelectorAll('h1,h2,h3,h4,h5,h6')]
  .map(h => [Number(h.tagName[1]), h.textContent.trim().slice(0, 60)])"""


def assert_headings(levels: list[list[Any]]) -> None:
    """One h1, first; no level skipped on the way down."""
    assert levels, "no headings"
    assert [lv for lv, _ in levels].count(1) == 1, levels
    assert levels[0][0] == 1, levels
    for (prev, _), (cur, text) in itertools.pairwise(levels):
        assert cur <= prev + 1, f"heading '{text}' (h{cur}) skips a level after h{prev}"


CONTRAST_JS = """(selector) => {
  const parse = (c) => {
    const m = c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
  };
  const lum = (c) => {
    const f = (v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
  };
  const over = (top, under) => ({
    r: top.r * top.a + under.r * (1 - top.a),
    g: top.g * top.a + under.g * (1 - top.a),
    b: top.b * top.a + under.b * (1 - top.a), a: 1});
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; }
    }
    let out = {r: 255, g: 255, b: 255, a: 1};
    for (let i = layers.length - 1; i >= 0; i--) out = over(layers[i], out);
    return out;
  };
  return [...document.querySelectorAll(selector)]
    .filter((el) => el.getClientRects().length && el.textContent.trim())
    .map((el) => {
      const bg = background(el);
      const fg = over(parse(getComputedStyle(el).color), bg);
      const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
      return {text: el.textContent.trim().slice(0, 40), ratio: (a + 0.05) / (b + 0.05)};
    });
}"""


def assert_contrast(page: Any, selectors: list[str], minimum: float = 4.5) -> int:
    """Every visible element matching each selector has text contrast >= minimum; returns
    how many elements were measured."""
    measured = 0
    for sel in selectors:
        found = page.evaluate(CONTRAST_JS, sel)
        low = [f for f in found if f["ratio"] < minimum]
        assert not low, f"{sel}: contrast below {minimum}:1: {low[:5]}"
        measured += len(found)
    return measured


FOCUSED_JS = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const cs = getComputedStyle(el);
  return {tag: el.tagName.toLowerCase(), id: el.id, name: el.getAttribute('name'),
          href: el.getAttribute('href'), text: (el.textContent || '').trim().slice(0, 40),
          focusVisible: el.matches(':focus-visible'),
          outline: cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) >= 2};
}"""


def tab_through(page: Any, presses: int) -> list[dict[str, Any]]:
    """Press Tab `presses` times from the top of the page; what had focus after each press."""
    page.evaluate(
        "() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }"
    )
    seen = []
    for _ in range(presses):
        page.keyboard.press("Tab")
        info = page.evaluate(FOCUSED_JS)
        if info is not None:
            seen.append(info)
    return seen
