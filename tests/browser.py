"""Headless Chromium for the tests that must see what a person's browser sees (the console).

A real browser, not an HTTP client: cookies' SameSite and HttpOnly, the Content-Security-Policy
that blocks inline script, redirects and forms are the browser's to enforce, so only a browser can
show they hold. Debian's ``chromium`` and ``chromium-driver`` (scripts/test.sh installs them as
root) driven through Selenium's WebDriver client, pointed at the driver and browser by path so
Selenium Manager never tries to download one (there is no internet here).

Selenium's API blocks; :class:`Browser` runs each call in a worker thread so the daemon's and the
fakes' event loop keeps serving while the page loads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
DRIVER = ("/usr/bin/chromedriver",)


def _first(paths: tuple[str, ...], name: str) -> str | None:
    for path in paths:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def missing() -> str | None:
    """Why no browser test can run here, or None when one can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if _first(CHROMIUM, "chromium") is None:
        return "Debian's chromium is not installed (scripts/test.sh installs it as root)"
    if _first(DRIVER, "chromedriver") is None:
        return "Debian's chromium-driver is not installed (scripts/test.sh installs it as root)"
    return None


class Browser:
    """One headless Chromium session (its own profile: cookies never leak between tests)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def get(self, url: str) -> None:
        await self.call(self.driver.get, url)

    async def text(self) -> str:
        """The page's visible text (what a person reads)."""
        return str(await self.call(lambda: self.driver.find_element("tag name", "body").text))

    async def source(self) -> str:
        return str(await self.call(lambda: self.driver.page_source))

    async def url(self) -> str:
        return str(await self.call(lambda: self.driver.current_url))

    async def cookies(self) -> list[dict[str, Any]]:
        return list(await self.call(self.driver.get_cookies))

    async def logs(self) -> list[dict[str, Any]]:
        """The console's messages (a Content-Security-Policy violation shows here)."""
        return list(await self.call(self.driver.get_log, "browser"))

    async def screenshot(self, path: Path) -> None:
        await self.call(self.driver.save_screenshot, str(path))


@asynccontextmanager
async def chromium(width: int = 1280, height: int = 900) -> AsyncIterator[Browser]:
    """A fresh headless Chromium. ``--no-sandbox``: the tests run as root, where Chromium refuses
    its own sandbox; the pages it opens are our console on 127.0.0.1. Proxies are bypassed: a
    proxy from the environment must never see the console's cookie."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chital-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(_first(CHROMIUM, "chromium"))
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--proxy-server=direct://",
        "--proxy-bypass-list=*",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(str(_first(DRIVER, "chromedriver")))
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never reach out for a driver
    driver = await asyncio.to_thread(webdriver.Chrome, service=service, options=options)
    try:
        yield Browser(driver)
    finally:
        await asyncio.to_thread(driver.quit)
        shutil.rmtree(profile, ignore_errors=True)
