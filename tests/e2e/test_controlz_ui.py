"""/debug/ui in a real headless Chromium (Debian's, driven by selenium through its chromedriver):
the page lists a connected real Envoy as synced, shows the pushes and a rejected document, and
changing a scope's level with the page's select changes what the server logs."""

from __future__ import annotations

import asyncio
import json
import struct
import textwrap
import zlib
from pathlib import Path

import pytest

from tests.e2e.mesh_config import endpoint_slice_yaml, service_yaml
from tests.e2e.test_ads_protocol import CDS, Sotw
from tests.support.browser import chromium
from tests.support.control_plane import ControlPlane
from tests.support.envoy import Envoy
from tests.support.node import sidecar_node_id
from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.timeout(180)
NODE = sidecar_node_id("ui-1")
NACKER = "sidecar~10.0.0.9~nacker-1.default~default.svc.cluster.local"
# Chromium starts in seconds when idle; a loaded two-core machine has been seen to need far more.
PAGE_DEADLINE = 60.0

# What the test reads of the page, in one run of a script on the page's thread.
SNAPSHOT = """
const text = (sel) => { const e = document.querySelector(sel); return e ? e.innerText : null; };
const cell = (id) => document.querySelector('td[data-proxy="' + id + '"]');
const row = (id) => cell(id) ? cell(id).parentElement.innerText : null;
const plot = document.getElementById("push-svg");
const level = document.getElementById("level-ads");
const status = document.getElementById("scope-status");
return {proxy: row(arguments[0]), nacker: row(arguments[1]), rejected: text("#rejected-table"),
        nacks: text("#nack-table"), plot: plot ? plot.innerHTML : null, ads_level: level ? level.value : null,
        scope_changed: status.getAttribute("data-changed"), scope_status: status.innerText,
        newest_push: text("#push-table tbody tr"),
        proxy_bottom: cell(arguments[0]) ? cell(arguments[0]).getBoundingClientRect().bottom : null,
        viewport: window.innerHeight};
"""

BAD_VS = textwrap.dedent("""\
    apiVersion: networking.istio.io/v1
    kind: VirtualService
    metadata: {name: misspelt, namespace: default}
    spec:
      hosts: [web]
      http:
      - timout: 5s
        route:
        - destination: {host: web}
    """)


def png_facts(path: Path) -> tuple[int, int, int]:
    """Width, height and the number of distinct (filtered) rows: a blank page has one or two,
    a page of tables hundreds."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            bpp = {2: 3, 6: 4, 0: 1, 4: 2}[color] * depth // 8
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * bpp
    rows = {raw[i:i + stride] for i in range(0, len(raw), stride)}
    return width, height, len(rows)


async def _scopes(cp: ControlPlane) -> dict[str, dict]:
    return {s["name"]: s for s in await cp.debug("/debug/scopes")}


async def test_controlz_page_shows_the_proxy_and_changes_a_log_level(tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    cp = ControlPlane(tmp_path)
    cp.write("svc.yaml", service_yaml("web", free_port()) + "---\n" + endpoint_slice_yaml("web", free_port()))
    cp.write("bad-vs.yaml", BAD_VS)
    envoy = Envoy()
    async with cp:
        await envoy.start(Envoy.bootstrap(NODE, cp.xds_port), tmp_path)
        try:
            await envoy.wait_ready()
            await cp.wait_synced(NODE)
            assert (await _scopes(cp))["ads"]["output_level"] == "info"
            # A second client that rejects its clusters: the page must show who and why.
            nacker = Sotw(cp.xds_port, NACKER)
            await nacker.request(CDS)
            cds = await nacker.read()
            await nacker.request(CDS, nonce=cds.nonce, error="cluster web: bogus setting (from the test)")
            url = f"http://127.0.0.1:{cp.ports['http']}/debug/ui"

            with chromium(tmp_path) as driver:
                # The page re-renders itself every few seconds, so an element found a moment ago
                # may be gone: state is read in one script run (atomic on the page's thread).
                wait = WebDriverWait(driver, PAGE_DEADLINE, ignored_exceptions=(StaleElementReferenceException,))

                def page() -> dict:
                    return driver.execute_script(SNAPSHOT, NODE, NACKER)

                def until(ok) -> dict:
                    return wait.until(lambda _d: (snap := page()) and ok(snap) and snap)

                def load() -> dict:
                    driver.get(url)
                    # The first render, then until the NACK shows (the page's own refresh, with a deadline).
                    return until(lambda s: "SYNCED" in (s["proxy"] or "") and s["nacks"])

                snap = await asyncio.to_thread(load)
                assert "ui-1.default" in snap["proxy"] and "sidecar" in snap["proxy"]
                assert "NACKED" in snap["nacker"]
                assert "bogus setting (from the test)" in snap["nacks"] and NACKER in snap["nacks"]
                assert "cds" in snap["nacks"] and "Service/default/web" in snap["nacks"]  # the config behind it
                rejected = snap["rejected"]
                assert "VirtualService" in rejected and "misspelt" in rejected and "timout" in rejected
                assert "stage-debounce" in snap["plot"] and "stage-context_build" in snap["plot"]  # real pushes
                assert snap["ads_level"] == "info"

                def change_level() -> str:
                    def pick(d) -> bool:
                        Select(d.find_element(By.ID, "level-ads")).select_by_value("debug")  # fires onchange
                        return True

                    wait.until(pick)
                    return until(lambda s: s["scope_changed"] == "ads:debug")["scope_status"]

                assert await asyncio.to_thread(change_level) == "ads is now at debug"

                # Server side: the scope has its own level now, the others still inherit info ...
                scopes = await _scopes(cp)
                assert scopes["ads"] == {"name": "ads", "output_level": "debug", "own_level": True}
                assert scopes["default"]["output_level"] == "info"
                assert scopes["files"] == {"name": "files", "output_level": "info", "own_level": False}
                # ... and it logs at that level: a push's ACKs now show as ADS debug lines.
                before = _ads_debug_lines(cp)
                cp.write("svc2.yaml", service_yaml("other", free_port()))
                await wait_for(lambda: _ads_debug_lines(cp) > before, 30, message="ADS debug lines after the change")

                def pushed(s: dict) -> bool:
                    # Columns ... PROXIES RESPONSES ACKS NACKS CONVERGED. Both clients are pushed;
                    # the Envoy ACKs, the other client never answers again.
                    row = s["newest_push"] or ""
                    if "Service/default/other" not in row:
                        return False
                    proxies, responses, acks, nacks = (int(n) for n in row.split()[-6:-2])
                    return proxies == 2 and 1 <= acks < responses and nacks == 0

                def screenshot() -> tuple[Path, dict]:
                    snap = until(pushed)
                    shot = tmp_path / "controlz.png"
                    driver.save_screenshot(str(shot))
                    return shot, snap

                shot, snap = await asyncio.to_thread(screenshot)
                assert snap["newest_push"].endswith(" ms") and not snap["newest_push"].endswith(" 0.0 ms")
                # The proxy table is at the top of the page: inside the captured viewport.
                assert 0 < snap["proxy_bottom"] < snap["viewport"], snap
                width, height, distinct_rows = png_facts(shot)
                assert width >= 1000 and height >= 800, (width, height)
                assert distinct_rows >= 150, f"the screenshot looks blank: {distinct_rows} distinct rows"
        finally:
            await nacker.close()
            await envoy.stop()


def _ads_debug_lines(cp: ControlPlane) -> int:
    text = cp.log_path.read_text()
    return sum(1 for line in text.splitlines() if "[debug" in line and "scope=ads" in line)


async def test_scope_endpoint_refuses_bad_input_and_other_sites(tmp_path):
    """What a script or another page gets: a clear refusal, nothing changed. And what the page's
    data shows of the environment: no credential."""
    import aiohttp

    secret = "s3cr3t-not-to-be-shown"
    env = {"MY_API_TOKEN": secret, "UPSTREAM_URL": f"https://user:{secret}@example.test/x",
           "PILOT_NOT_A_KNOB": "1", "PILOT_PUSH_THROTTLE": "50"}
    async with ControlPlane(tmp_path, env=env) as cp:
        base = f"http://127.0.0.1:{cp.ports['http']}/debug/scopes"
        status, body = await cp.get("/debug/controlz")
        assert status == 200 and secret not in body
        rows = {e["name"]: e for e in json.loads(body)["env"]}
        assert rows["MY_API_TOKEN"] == {"name": "MY_API_TOKEN", "value": f"<redacted: {len(secret)} chars>",
                                        "redacted": True}
        assert rows["UPSTREAM_URL"]["value"] == "https://user:***@example.test/x"
        assert rows["PILOT_NOT_A_KNOB"]["unknown"] is True
        assert rows["PILOT_PUSH_THROTTLE"]["value"] == "50" and rows["PILOT_PUSH_THROTTLE"]["knob"]
        async with aiohttp.ClientSession() as s:
            # The index: a page of links for a browser, a described list for a program.
            async with s.get(f"http://127.0.0.1:{cp.ports['http']}/debug", headers={"Accept": "text/html"}) as r:
                page = await r.text()
                assert r.content_type == "text/html" and '<a href="/debug/ui">' in page
            listed = {e["path"]: e for e in (await cp.debug("/debug"))["endpoints"]}
            assert "ControlZ" in listed["/debug/ui"]["description"]
            assert listed["/debug/scopes"]["methods"] == ["GET"]
            assert "ui" in await cp.debug("/debug/list")
            cases = [
                ("ads", {"json": {"output_level": "loud"}}, 400, "unknown log level"),
                ("nope", {"json": {"output_level": "debug"}}, 404, "unknown log scope"),
                ("ads", {"data": "output_level=debug",
                         "headers": {"Content-Type": "application/x-www-form-urlencoded"}}, 415, "send JSON"),
                ("ads", {"data": "{", "headers": {"Content-Type": "application/json"}}, 400, "not JSON"),
                ("ads", {"json": ["debug"]}, 400, "output_level"),
                ("ads", {"json": {"output_level": "debug"}, "headers": {"Origin": "http://evil.example"}},
                 403, "another site"),
            ]
            for scope, kw, code, words in cases:
                async with s.put(f"{base}/{scope}", **kw) as r:
                    body = await r.text()
                    assert r.status == code and words in body, (scope, kw, r.status, body)
            async with s.get(base) as r:
                assert {x["name"]: x["output_level"] for x in json.loads(await r.text())}["ads"] == "info"
            async with s.post(f"{base}/default", json={"output_level": "WARN"}) as r:
                assert r.status == 200 and json.loads(await r.text())["output_level"] == "warn"
            async with s.get(base) as r:
                levels = {x["name"]: x["output_level"] for x in json.loads(await r.text())}
                assert levels["default"] == "warn" and levels["ads"] == "warn"  # inherited
