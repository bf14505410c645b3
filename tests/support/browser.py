"""A real headless Chromium for page tests: Debian's `chromium` and `chromium-driver` (installed by
`make browser`, which `make test` runs), driven by selenium through that chromedriver. Selenium
never downloads a browser or driver here: both paths are given."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

INSTALL_HINT = ("needs Debian's chromium and chromium-driver: `make browser` installs them as root "
                "(else: sudo apt-get install chromium chromium-driver)")


def binaries() -> tuple[str, str]:
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
    missing = [p for p in (chromium, driver) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: {INSTALL_HINT}")
    return chromium, driver


@contextlib.contextmanager
def chromium(workdir: Path, width: int = 1400, height: int = 1500) -> Iterator:
    """A headless Chromium with its own profile under `workdir`; closed on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                f"--window-size={width},{height}", f"--user-data-dir={workdir / 'chromium-profile'}"):
        options.add_argument(arg)
    service = Service(executable_path=driver_path, log_output=str(workdir / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()
