"""The page in a real browser: headless Chromium (Debian's `chromium`), driven over the DevTools
protocol, loads `/` from a live `memplan serve` on 127.0.0.1, uploads a profile, moves the budget
with the keyboard and by typing, and checks that the stage table, the summary, the timeline and
the frontier show exactly the numbers the API gives for the same request. Every request the page
makes is recorded in the browser and must go to the server. Screenshots are kept under the test's
tmp dir (the path is printed; `pytest -s` shows it).

Without Chromium these tests skip, saying how to install it.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import make_profile
from tests.service.server import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="needs Chromium for the browser tests: apt-get install -y chromium (Debian's package)",
    ),
    pytest.mark.timeout(300),
]

websocket = pytest.importorskip(
    "websocket", reason="needs websocket-client (pip install -e '.[dev]') to drive Chromium"
)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio",
         "--window-size=1280,1800", "--remote-debugging-port=0"]


class Serve:
    """`memplan serve` on 127.0.0.1 and a free port, with its own store and the fake job functions."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        memplan = Path(sys.executable).with_name("memplan")
        cmd = ([str(memplan)] if memplan.exists() else [sys.executable, "-c", "from memplan.cli import main; main()"])
        self.log = data_dir / "serve.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                 "--data-dir", str(data_dir), "--log-level", "warning"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "MEMPLAN_RUN_JOB": "tests.service.fake_jobs:run",
                     "MEMPLAN_PROFILE_JOB": "tests.service.fake_jobs:profile",
                     "MEMPLAN_HEARTBEAT_S": "0.2",
                     "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                     **(env or {})},
            )

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"memplan serve exited:\n{self.log.read_text()}")
            try:
                return httpx.get(self.url + "/v1/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout_s=60, every_s=0.1, what="memplan serve to answer")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Browser:
    """Headless Chromium and one page, over the DevTools protocol (websocket-client)."""

    def __init__(self, profile_dir: Path) -> None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        port_file = profile_dir / "DevToolsActivePort"
        wait_for(lambda: port_file.exists() and len(port_file.read_text().split()) >= 2,
                 timeout_s=60, every_s=0.1, what="Chromium's DevTools port")
        port = int(port_file.read_text().split()[0])
        targets = wait_for(lambda: [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                                    if t.get("type") == "page"], timeout_s=30, what="a page target")
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Network", "DOM", "Log"):
            self.send(f"{domain}.enable")

    def send(self, method: str, **params) -> dict:
        """Call a DevTools method; returns its result (events that arrive meanwhile are kept)."""
        mid = next(self.ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def js(self, expr: str):
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        r = self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, what: str, timeout_s: float = 60.0):
        return wait_for(lambda: self.js(expr), timeout_s=timeout_s, every_s=0.05, what=what)

    def key(self, key: str, code: str | None = None, vk: int | None = None) -> None:
        """Press and release one key in the focused element, as a user would."""
        extra = {"windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk} if vk else {}
        text = {"Enter": "\r"}.get(key)  # a key with text makes a keypress (implicit submission)
        down = {"type": "keyDown", "text": text} if text else {"type": "rawKeyDown"}
        self.send("Input.dispatchKeyEvent", key=key, code=code or key, **down, **extra)
        self.send("Input.dispatchKeyEvent", type="keyUp", key=key, code=code or key, **extra)

    def type(self, text: str) -> None:
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"screenshot: {path}")
        return path

    def requests(self) -> list[str]:
        """URLs of every request the page made so far (as the browser's network layer saw them)."""
        self.send("Runtime.evaluate", expression="0")  # flush events already sent
        return [e["params"]["request"]["url"] for e in self.events
                if e["method"] == "Network.requestWillBeSent"]

    def errors(self) -> list[str]:
        return [json.dumps(e["params"])[:500] for e in self.events
                if e["method"] == "Runtime.exceptionThrown"
                or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
                    and e["params"]["entry"].get("source") != "network")]

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    srv = Serve(tmp_path_factory.mktemp("ui-serve"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def keyed_serve(tmp_path_factory):
    srv = Serve(tmp_path_factory.mktemp("ui-serve-key"), env={"MEMPLAN_API_KEY": "s3cret"})
    yield srv
    srv.stop()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "chromium-profile")
    yield b
    b.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ui-screenshots")
    print(f"screenshots in {path}")
    return path


def open_page(b: Browser, url: str) -> None:
    b.send("Page.navigate", url=url + "/")
    b.wait("document.readyState === 'complete' && document.body.dataset.ready === '1'", "the page to start")


def pick_file(b: Browser, path: Path, selector: str = "#upload") -> None:
    """Pick `path` in the page's file input `selector`, as a user choosing a file."""
    node = b.send("DOM.querySelector", nodeId=b.send("DOM.getDocument")["root"]["nodeId"], selector=selector)
    b.send("DOM.setFileInputFiles", files=[str(path)], nodeId=node["nodeId"])


def upload_profile(b: Browser, profile: dict, path: Path) -> None:
    """Write `profile` to `path` as JSON and pick it in the page's profile upload."""
    path.write_text(json.dumps(profile))
    pick_file(b, path)


def upload_and_plan(b: Browser, profile: dict, path: Path, *, shows: str | None = None) -> None:
    """`upload_profile`, then wait for the page's first plan (and, given `shows`, for the profile
    line to include it)."""
    upload_profile(b, profile, path)
    named = (f"document.querySelector('#profile-info').textContent.includes({json.dumps(shows)}) && "
             if shows else "")
    b.wait(named + "Number(document.querySelector('#plan-section').dataset.seq) >= 1", "the first plan")


def api_frontier(url: str, profile: dict, timeout_s: float = 60) -> dict:
    """What POST /v1/plans/frontier answers for `profile` at 60 points."""
    return httpx.post(url + "/v1/plans/frontier", json={"profile": profile, "options": {"points": 60}},
                      timeout=timeout_s).json()


def shown(b: Browser) -> dict:
    """What the page shows for its current plan, read from the DOM."""
    return b.js("""(() => {
      const cells = (sel, col) => [...document.querySelectorAll(sel + ' tbody tr')].map(r => r.cells[col].textContent);
      const data = (sel, col) => [...document.querySelectorAll(sel + ' tbody tr')].map(r => Number(r.cells[col].dataset.bytes));
      return {
        budget: Number(document.querySelector('#plan-section').dataset.budget),
        peak: Number(document.querySelector('#sum-peak').dataset.bytes),
        seconds: Number(document.querySelector('#sum-time').dataset.seconds),
        overhead: Number(document.querySelector('#sum-overhead').dataset.overhead),
        roles: cells('#stages', 2),
        forwards: cells('#stages', 3).map(Number),
        policies: cells('#stages', 5),
        timeline: data('#timeline-table', 2),
        ops: cells('#timeline-table', 1),
        chart_ops: Number(document.querySelector('#timeline-line').dataset.ops),
        chart_peak: Number(document.querySelector('#timeline-peak').dataset.bytes),
        chart_peak_op: Number(document.querySelector('#timeline-peak').dataset.op),
        frontier: data('#frontier-table', 1),
        baselines: data('#baselines-table', 1),
        frontier_current: Number(document.querySelector('#frontier-current').dataset.bytes),
        frontier_markers: document.querySelectorAll('#frontier-chart .baseline').length,
      };
    })()""")


def check_against_api(b: Browser, url: str, profile: dict, frontier: dict) -> dict:
    """The page's numbers equal the API's for the budget the page last planned."""
    got = shown(b)
    body = {"profile": profile, "budget_bytes": got["budget"], "strategy": "optimal"}
    api = httpx.post(url + "/v1/plans/timeline", json=body, timeout=60).json()
    plain = httpx.post(url + "/v1/plans", json=body, timeout=60).json()
    plan, tl = api["plan"], api["timeline"]
    # the page's route answers POST /v1/plans' plan (the message may carry the solve's seconds)
    assert {**plan, "message": ""} == {**plain, "message": ""}
    assert got["peak"] == plan["predicted"]["peak_bytes"]
    assert got["seconds"] == plan["predicted"]["time_s"]
    assert got["overhead"] == plan["predicted"]["overhead"]
    assert got["roles"] == [s["role"] for s in tl["stages"]]
    assert got["forwards"] == [s["forwards"] for s in tl["stages"]]
    assert got["policies"] == [plan["stage_policies"].get(str(s["stage"]), "all") for s in tl["stages"]]
    assert got["policies"] == [s["policy"] for s in tl["stages"]]
    assert got["timeline"] == tl["predicted_bytes"]
    assert got["ops"] == [" ".join(map(str, op)) for op in plan["schedule"]]
    assert got["chart_ops"] == len(plan["schedule"])
    assert (got["chart_peak"], got["chart_peak_op"]) == (tl["peak_bytes"], tl["peak_op"])
    assert got["frontier"] == [p["peak_bytes"] for p in frontier["points"]]
    assert got["baselines"] == [p["peak_bytes"] for p in frontier["baselines"]]
    assert got["frontier_markers"] == len(frontier["baselines"])
    assert got["frontier_current"] == plan["predicted"]["peak_bytes"]
    return got


def test_upload_move_budget_and_see_the_api_numbers(serve, browser, tmp_path, artifacts):
    b = browser
    open_page(b, serve.url)
    profile = make_profile(12)
    frontier = api_frontier(serve.url, profile)

    # upload through the file input, as a user picking a file
    upload_and_plan(b, profile, tmp_path / "chain12.json")
    assert "chain12" in b.js("document.querySelector('#profile-info').textContent")
    first = check_against_api(b, serve.url, profile, frontier)
    assert first["budget"] == frontier["least_peak_bytes"] + round(
        0.5 * (frontier["store_all_peak_bytes"] - frontier["least_peak_bytes"]))
    b.screenshot(artifacts / "1-uploaded.png")

    # the slider, by keyboard: Home is the least feasible budget
    b.js("document.querySelector('#budget-range').focus()")
    b.key("Home", vk=36)
    b.wait(f"Number(document.querySelector('#plan-section').dataset.budget) === {frontier['least_peak_bytes']}",
           "the plan at the least budget")
    least = check_against_api(b, serve.url, profile, frontier)
    assert least["peak"] <= frontier["least_peak_bytes"] < first["peak"]
    assert least["roles"] != first["roles"]  # more is recomputed
    assert sum(least["forwards"]) > sum(first["forwards"])
    b.screenshot(artifacts / "2-least-budget.png")

    # typed: store-all's peak gives the store-all plan (every stage stored, no recompute)
    b.js("(() => { const t = document.querySelector('#budget-text'); t.focus(); t.select(); })()")
    b.type(f"{frontier['store_all_peak_bytes']}B")
    b.key("Enter", vk=13)
    b.wait(f"Number(document.querySelector('#plan-section').dataset.budget) === {frontier['store_all_peak_bytes']}",
           "the plan at the typed budget")
    full = check_against_api(b, serve.url, profile, frontier)
    assert set(full["roles"]) == {"stored"} and full["overhead"] == 0
    assert b.js("Number(document.querySelector('#budget-range').value)") == 1000

    # the timeline names the op under the keyboard cursor and under the pointer
    b.js("document.querySelector('#timeline-chart').focus()")
    b.key("End", vk=35)
    assert b.js("document.querySelector('#timeline-cursor').textContent").startswith(
        f"op {len(full['ops']) - 1} of {len(full['ops'])}: B 1")
    box = b.js("(() => { const r = document.querySelector('#timeline-chart').getBoundingClientRect();"
               " return [r.left, r.top, r.width, r.height]; })()")
    b.send("Input.dispatchMouseEvent", type="mouseMoved", x=box[0] + box[2] * (70 + 0.5 * (860 - 82) / len(full["ops"])) / 860,
           y=box[1] + box[3] / 2)
    b.wait("document.querySelector('#timeline-cursor').dataset.op === '0'", "the op under the pointer")
    assert b.js("document.querySelector('#timeline-cursor').textContent").startswith(f"op 0 of {len(full['ops'])}: R 1")
    b.screenshot(artifacts / "3-store-all.png")

    # a bad typed budget: one clear message naming the field, and the plan stays
    b.js("(() => { const t = document.querySelector('#budget-text'); t.focus(); t.select(); })()")
    b.type("eight gigs")
    b.key("Enter", vk=13)
    assert b.js("document.querySelector('#budget-error').textContent").startswith("budget: cannot read")

    assert b.errors() == []
    urls = b.requests()
    assert any(u.endswith("/v1/plans/timeline") for u in urls)
    outside = [u for u in urls if not u.startswith(serve.url + "/")]
    assert outside == [], f"the page made requests outside the server: {outside}"


def test_save_policies_are_named_per_stage(serve, browser, tmp_path):
    # a profile whose stages may also be recorded keeping part of their tensors (section 10.8):
    # at the least budget the plan records some under a policy, and the page names which
    b = browser
    open_page(b, serve.url)
    profile = make_profile(8)
    for la in profile["layers"][1:-1]:
        la["policies"] = [{"name": "matmuls", "recompute": ["aten.gelu"],
                           "saved_bytes": la["saved_bytes"] // 3, "backward_temp_bytes": 0,
                           "forward_s": la["forward_s"], "backward_s": la["backward_s"] * 1.1}]
    frontier = api_frontier(serve.url, profile)
    upload_and_plan(b, profile, tmp_path / "policies8.json", shows="policies8")
    b.js("document.querySelector('#budget-range').focus()")
    b.key("Home", vk=36)
    b.wait(f"Number(document.querySelector('#plan-section').dataset.budget) === {frontier['least_peak_bytes']}",
           "the plan at the least budget")
    got = check_against_api(b, serve.url, profile, frontier)
    assert "matmuls" in got["policies"]
    assert b.errors() == []


def test_offload_bandwidth_plans_and_shows_what_moves(serve, browser, tmp_path, artifacts):
    # docs/chain-model.md section 10.9: with a bandwidth typed, the optimal plan may move records
    # and inputs to host memory; the page shows the host peak, the wait and what each stage moves
    b = browser
    open_page(b, serve.url)
    profile = make_profile(8)
    upload_and_plan(b, profile, tmp_path / "offload8.json", shows="chain8")
    assert b.js("document.querySelector('#sum-host').textContent") == "-"
    b.js("(() => { const t = document.querySelector('#offload-text'); t.focus(); t.select(); })()")
    b.type("2MB/s")
    b.key("Tab", vk=9)  # change fires on leaving the field
    b.wait("document.querySelector('#plan-section').dataset.offload === '2000000'", "the offload plan")
    budget = int(b.js("document.querySelector('#plan-section').dataset.budget"))
    body = {"profile": profile, "budget_bytes": budget, "strategy": "optimal",
            "options": {"offload_bandwidth": 2e6}}
    api = httpx.post(serve.url + "/v1/plans/timeline", json=body, timeout=60).json()
    plan = api["plan"]
    assert any(op[0].startswith("offload") for op in plan["schedule"]), plan["schedule"]
    got = b.js("""(() => ({
      host: Number(document.querySelector('#sum-host').dataset.bytes),
      wait: Number(document.querySelector('#sum-wait').dataset.seconds),
      seconds: Number(document.querySelector('#sum-time').dataset.seconds),
      moved: [...document.querySelectorAll('#stages tbody tr')].map(r => r.cells[7].textContent),
      ops: [...document.querySelectorAll('#timeline-table tbody tr')].map(r => r.cells[1].textContent),
    }))()""")
    assert got["host"] == plan["predicted"]["host_peak_bytes"] > 0
    assert got["wait"] == plan["predicted"]["transfer_wait_s"]
    assert got["seconds"] == plan["predicted"]["time_s"]
    kinds = {i: {op[0] for op in plan["schedule"] if len(op) > 1 and op[1] == i} for i in range(1, 9)}
    assert got["moved"] == [", ".join(w for k, w in (("offload", "output"), ("offload_record", "record"))
                                      if k in kinds[i]) for i in range(1, 9)]
    assert got["ops"] == [" ".join(map(str, op)) for op in plan["schedule"]]
    # the timeline draws the host bytes beside the device's, and the cursor names them
    assert b.js("Number(document.querySelector('#timeline-host').dataset.peak)") == got["host"]
    tl = api["timeline"]
    k = tl["predicted_host_bytes"].index(tl["host_peak_bytes"])
    b.js("document.querySelector('#timeline-chart').focus()")
    b.key("Home", vk=36)
    for _ in range(k):
        b.key("ArrowRight", vk=39)
    label = b.js("document.querySelector('#timeline-cursor').textContent")
    from memplan.planner.units import format_bytes  # the page's fmtBytes, in Python

    assert label.startswith(f"op {k} of ") and f"{format_bytes(tl['host_peak_bytes'])} on the host" in label
    b.screenshot(artifacts / "offload.png")
    # another strategy plans without offload, and the page says so
    b.js("(() => { const s = document.querySelector('#strategy'); s.value = 'sqrt';"
         " s.dispatchEvent(new Event('change')); })()")
    b.wait("document.querySelector('#plan-section').dataset.strategy === 'sqrt'", "the sqrt plan")
    assert b.js("document.querySelector('#plan-section').dataset.offload") == ""
    assert "only the optimal strategy plans offload" in b.js("document.querySelector('#offload-error').textContent")
    assert b.js("document.querySelector('#sum-host').textContent") == "-"
    b.js("(() => { const s = document.querySelector('#strategy'); s.value = 'optimal';"
         " s.dispatchEvent(new Event('change')); })()")
    b.wait("document.querySelector('#plan-section').dataset.offload === '2000000'", "the offload plan again")
    # a bad bandwidth: a message naming the field, and the plan stays
    b.js("(() => { const t = document.querySelector('#offload-text'); t.focus(); t.select(); })()")
    b.type("fast")
    b.key("Tab", vk=9)
    b.wait("document.querySelector('#offload-error').textContent !== ''", "the bandwidth's error")
    assert b.js("document.querySelector('#offload-error').textContent").startswith(
        "offload bandwidth: cannot read")
    assert b.errors() == []


def test_example_frontier_sizing_and_no_outside_requests(serve, browser, artifacts):
    b = browser
    open_page(b, serve.url)
    names = b.js("[...document.querySelectorAll('#example option')].map(o => o.value).filter(Boolean)")
    assert names == [e["name"] for e in httpx.get(serve.url + "/v1/examples").json()]
    b.js("(() => { const s = document.querySelector('#example'); s.value = 'gpt24';"
         " s.dispatchEvent(new Event('change')); })()")
    b.wait("Number(document.querySelector('#plan-section').dataset.seq) >= 1", "the example's plan", timeout_s=120)
    gpt24 = httpx.get(serve.url + "/v1/examples/gpt24").json()
    frontier = api_frontier(serve.url, gpt24, timeout_s=120)
    check_against_api(b, serve.url, gpt24, frontier)

    # the sizing form answers what GET /v1/sizing answers
    b.js("document.querySelector('#sz-compute').value = '5.76e23';"
         "document.querySelector('#sz-law').value = 'hoffmann';"
         "document.querySelector('#sizing-form').requestSubmit()")
    b.wait("document.querySelector('#sizing-out [data-key=params]') !== null", "the sizing answer")
    want = httpx.get(serve.url + "/v1/sizing", params={"compute_flops": 5.76e23, "law": "hoffmann",
                                                       "devices": 1}).json()
    got = float(b.js("document.querySelector('#sizing-out [data-key=params]').textContent"))
    assert got == pytest.approx(want["params"], rel=1e-4)
    b.js("window.scrollTo(0, 0)")
    b.screenshot(artifacts / "4-example-gpt24.png")

    assert b.errors() == []
    outside = [u for u in b.requests() if not u.startswith(serve.url + "/")]
    assert outside == [], f"the page made requests outside the server: {outside}"
    # and the page could not if it tried: its Content-Security-Policy refuses other origins
    blocked = b.js("""new Promise(done => {
        document.addEventListener('securitypolicyviolation', e => done(e.blockedURI), {once: true});
        fetch('http://198.51.100.1/x').catch(() => {});
        setTimeout(() => done(null), 5000);
      })""")
    assert blocked is not None and blocked.startswith("http://198.51.100.1")


def test_jobs_live_progress_and_cancel(serve, browser, artifacts):
    b = browser
    open_page(b, serve.url)
    # a run started from the page's form streams its progress to the end
    b.js("document.querySelector('#run-steps').value = '5'; document.querySelector('#run-form').requestSubmit()")
    run_id = b.wait("(() => { const li = document.querySelector('#jobs li[id^=job-]');"
                    " return li && li.id.slice(4); })()", "the run in the list")
    b.wait(f"document.getElementById('job-{run_id}').dataset.state === 'succeeded'", "the run to succeed")
    assert b.js(f"document.getElementById('job-{run_id}').querySelector('progress').value") == 1
    assert httpx.get(f"{serve.url}/v1/runs/{run_id}").json()["state"] == "succeeded"

    # a slow run, cancelled from the page
    slow = httpx.post(serve.url + "/v1/runs", json={"steps": 1000, "config": {"sleep_s": 0.05}}).json()
    b.js("document.querySelector('#jobs-refresh').click()")
    b.wait(f"(() => {{ const li = document.getElementById('job-{slow['id']}');"
           " return li && li.querySelector('button') !== null; })()", "the slow run's cancel button")
    b.wait(f"document.getElementById('job-{slow['id']}').querySelector('progress').value > 0",
           "the slow run's live progress")
    b.js(f"document.getElementById('job-{slow['id']}').querySelector('button').click()")
    wait_for(lambda: httpx.get(f"{serve.url}/v1/runs/{slow['id']}").json()["state"] == "cancelled",
             timeout_s=60, what="the run to be cancelled")
    b.wait(f"document.getElementById('job-{slow['id']}').dataset.state === 'cancelled'",
           "the page to show the cancel")
    b.screenshot(artifacts / "5-jobs.png")
    assert b.errors() == []


def run_ids(serve) -> list[str]:
    """The ids of the server's runs (the newest 500)."""
    return [j["id"] for j in httpx.get(f"{serve.url}/v1/runs", params={"limit": 500}).json()["items"]]


def new_run(b, before: list[str]) -> str:
    """The id of the first run the page's job list shows that is not in `before`, once it does."""
    return b.wait(f"(() => {{ const old = new Set({json.dumps(before)});"
                  " const li = [...document.querySelectorAll('#jobs li[id^=job-]')].find(l => !old.has(l.id.slice(4)));"
                  " return li && li.id.slice(4); })()", "the run in the list")


def test_a_run_from_the_page_takes_its_offload_bandwidth(serve, browser):
    """The run form sends the page's offload bandwidth with an optimal strategy (POST /v1/runs
    offload_bandwidth): at 1 B/s nothing moves, so the run succeeds on this CPU server."""
    b = browser
    open_page(b, serve.url)
    before = run_ids(serve)
    b.js("document.querySelector('#strategy').value = 'optimal';"
         "document.querySelector('#offload-text').value = '1B/s';"
         "document.querySelector('#run-steps').value = '2'; document.querySelector('#run-form').requestSubmit()")
    run_id = new_run(b, before)
    job = httpx.get(f"{serve.url}/v1/runs/{run_id}").json()
    assert (job["request"]["strategy"], job["request"]["offload_bandwidth"]) == ("optimal", 1.0)
    b.wait(f"document.getElementById('job-{run_id}').dataset.state === 'succeeded'", "the run to succeed")
    # a bandwidth the page cannot read is said beside the field, and nothing is sent
    n_runs = len(run_ids(serve))
    b.js("document.querySelector('#offload-text').value = 'fast';"
         "document.querySelector('#run-form').requestSubmit()")
    b.wait("document.querySelector('#offload-error').textContent.startsWith('offload bandwidth: cannot read')",
           "the bandwidth's error")
    assert len(run_ids(serve)) == n_runs
    assert b.errors() == []


def test_a_runs_measured_timeline_over_the_predicted_one(serve, browser, tmp_path, artifacts):
    from memplan.executor.timeline import measure_timeline, save_timeline

    from memplan import planner
    from tests.executor.synth import worked_chain

    stages, a0, prof = worked_chain()
    tl = measure_timeline(stages, a0, planner.plan(prof, strategy="sqrt"), prof)
    path = save_timeline(tl, tmp_path / "run.timeline.json")
    b = browser
    open_page(b, serve.url)

    pick_file(b, path, "#run-timeline")
    b.wait("document.querySelector('#timeline-measured') !== null", "the measured line")
    measured = b.js("[...document.querySelectorAll('#timeline-table tbody tr')].map(r => Number(r.cells[4].dataset.bytes))")
    predicted = b.js("[...document.querySelectorAll('#timeline-table tbody tr')].map(r => Number(r.cells[2].dataset.bytes))")
    assert measured == tl.measured_bytes and predicted == tl.predicted_bytes
    assert b.js("Number(document.querySelector('#timeline-measured').dataset.peak)") == max(tl.measured_bytes)
    assert "measured on cpu" in b.js("document.querySelector('#timeline-source').textContent")
    b.screenshot(artifacts / "6-run-timeline.png")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    pick_file(b, bad, "#run-timeline")
    b.wait("document.querySelector('#timeline-source').textContent.startsWith('run timeline: not a memplan-timeline/1')",
           "the refusal")
    assert b.errors() == []


def test_a_finished_runs_artifacts_download_and_its_timeline_is_drawn(serve, browser, tmp_path, artifacts):
    """A finished run job lists its artifacts on the page: a download link for the timeline it kept
    (the link fetches the exact bytes the API serves, and a click saves them), the snapshot's
    reason for being absent, and "Show timeline" draws the kept measured timeline over its
    prediction with the numbers of the artifact."""
    r = httpx.post(serve.url + "/v1/runs", json={"steps": 1, "config": {"timeline": 6}})
    job = wait_for(lambda: (j := httpx.get(f"{serve.url}/v1/runs/{r.json()['id']}").json())["state"] == "succeeded"
                   and j, timeout_s=60, what="the run to finish")
    href = next(a["href"] for a in job["artifacts"] if a["name"] == "timeline.json")
    want = httpx.get(serve.url + href).content
    tl = json.loads(want)
    b = browser
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    b.send("Page.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
    open_page(b, serve.url)  # the page lists the jobs as it starts: the run is there
    li = f"document.getElementById('job-{job['id']}')"
    b.wait(f"{li} && {li}.querySelector('a.artifact') !== null", "the run's download link")
    link = b.js(f"(() => {{ const a = {li}.querySelector('a.artifact[data-name=\"timeline.json\"]');"
                " return {href: a.getAttribute('href'), download: a.getAttribute('download'),"
                " label: a.getAttribute('aria-label')}; })()")
    assert link["href"] == href and link["download"].endswith("timeline.json")
    assert link["label"].startswith("download timeline.json")
    absent = b.js(f"{li}.querySelector('.absent[data-name=\"snapshot.pickle\"]').textContent")
    assert absent == "no snapshot.pickle: a fake run: no CUDA allocator to record"
    # the link's target, fetched from the page (same origin, the page's own request path)
    got = b.js(f"fetch({json.dumps(href)}).then(r => r.text().then(t => [r.status, r.headers.get('content-type'), t]))")
    assert got[0] == 200 and got[1] == "application/json" and got[2].encode() == want
    # a click downloads it: the file the browser saved holds the same bytes
    b.js(f"{li}.querySelector('a.artifact').click()")
    b.wait("document.body.dataset.downloads === '1' || document.querySelector('#jobs-error').textContent",
           "the download")
    assert b.js("document.querySelector('#jobs-error').textContent") == ""
    saved = wait_for(lambda: [p for p in downloads.iterdir() if p.name == link["download"]],
                     timeout_s=30, what=f"the downloaded file in {downloads}")
    assert saved[0].read_bytes() == want
    # the kept timeline drawn over the prediction, the numbers of the artifact
    b.js(f"{li}.querySelector('button.show-timeline').click()")
    b.wait("document.querySelector('#timeline-measured') !== null", "the measured line")
    measured = b.js("[...document.querySelectorAll('#timeline-table tbody tr')].map(r => Number(r.cells[4].dataset.bytes))")
    predicted = b.js("[...document.querySelectorAll('#timeline-table tbody tr')].map(r => Number(r.cells[2].dataset.bytes))")
    assert measured == tl["measured_bytes"] != predicted == tl["predicted_bytes"]
    assert b.js("Number(document.querySelector('#timeline-measured').dataset.peak)") == max(tl["measured_bytes"])
    source = b.js("document.querySelector('#timeline-source').textContent")
    assert source.startswith(f"run {job['id'][:12]}: chain6, sqrt plan, measured on cpu")
    b.screenshot(artifacts / "7-run-artifacts.png")
    assert b.errors() == []
    outside = [u for u in b.requests() if not u.startswith(serve.url + "/") and not u.startswith("blob:")]
    assert outside == [], f"the page made requests outside the server: {outside}"


def test_a_hugging_face_run_from_the_page(serve, browser):
    """The page's Hugging Face run form sends POST /v1/runs with model hf, the config as an object,
    the sequence, batch and loss (the lean one reusing the logits), and the budget, strategy and steps of the page; a config that is not
    JSON is one clear message and nothing is sent."""
    b = browser
    open_page(b, serve.url)
    before = run_ids(serve)
    cfg = {"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4}
    b.js("document.querySelector('#hf-run').open = true;"
         f"document.querySelector('#hf-run-config').value = {json.dumps(json.dumps(cfg))};"
         "document.querySelector('#hf-run-seq').value = '16'; document.querySelector('#hf-run-batch').value = '2';"
         "document.querySelector('#run-budget').value = '300KB'; document.querySelector('#run-steps').value = '2';"
         "document.querySelector('#strategy').value = 'heuristic';"
         "document.querySelector('#hf-run-loss').value = 'reuse';"
         "document.querySelector('#hf-run-form').requestSubmit()")
    run_id = new_run(b, before)
    job = httpx.get(f"{serve.url}/v1/runs/{run_id}").json()
    assert job["request"]["model"] == "hf" and job["request"]["config"] == {
        "hf_config": cfg, "seq": 16, "batch_size": 2, "lean_loss": True, "reuse_logits": True}
    assert (job["request"]["budget_bytes"], job["request"]["strategy"], job["request"]["steps"]) == (300_000, "heuristic", 2)
    b.wait(f"document.getElementById('job-{run_id}').dataset.state === 'succeeded'", "the run to succeed")
    n_runs = len(run_ids(serve))
    b.js("document.querySelector('#hf-run-config').value = '{not json';"
         "document.querySelector('#hf-run-form').requestSubmit()")
    b.wait("document.querySelector('#jobs-error').textContent.startsWith('Hugging Face run: config.json is not JSON')",
           "the refusal")
    assert len(run_ids(serve)) == n_runs
    assert b.errors() == []


def test_every_control_is_named_and_reached_by_keyboard(serve, browser):
    b = browser
    open_page(b, serve.url)
    b.js("(() => { const s = document.querySelector('#example'); s.value = 'resnet_like';"
         " s.dispatchEvent(new Event('change')); })()")
    b.wait("Number(document.querySelector('#plan-section').dataset.seq) >= 1", "the example's plan", timeout_s=120)
    b.send("Accessibility.enable")
    nodes = [n for n in b.send("Accessibility.getFullAXTree")["nodes"] if not n.get("ignored")]
    roles = ("textbox", "combobox", "slider", "button", "spinbutton", "checkbox", "image", "table")
    controls = [n for n in nodes if n.get("role", {}).get("value") in roles]
    unnamed = [(n["role"]["value"], n.get("backendDOMNodeId")) for n in controls
               if not str(n.get("name", {}).get("value", "")).strip()]
    assert len(controls) >= 20 and unnamed == []
    charts = {n["name"]["value"] for n in controls if n["role"]["value"] == "image"}
    assert any(c.startswith("3. Memory timeline op ") for c in charts), charts  # its name says the op
    assert any(c.startswith("4. Memory-time frontier") and "Pareto points" in c for c in charts), charts
    # Tab walks every control of the page, the charts included
    seen = []
    for _ in range(40):
        b.key("Tab", vk=9)
        seen.append(b.js("document.activeElement.id || document.activeElement.tagName"))
    assert {"example", "upload", "budget-range", "budget-text", "strategy", "run-timeline", "timeline-chart",
            "sz-compute", "sz-law", "run-layers", "jobs-refresh"} <= set(seen), seen
    assert b.errors() == []


def test_analytic_profile_from_a_hugging_face_config(serve, browser):
    b = browser
    open_page(b, serve.url)
    cfg = {"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
           "max_position_embeddings": 32, "vocab_size": 100, "model_type": "llama"}
    b.js(f"document.querySelector('#hf').open = true; document.querySelector('#hf-config').value = {json.dumps(json.dumps(cfg))};"
         "document.querySelector('#hf-batch').value = '2'; document.querySelector('#hf-go').click()")
    b.wait("document.querySelector('#profile-info').textContent.includes('analytic GPT')", "the analytic profile")
    job = httpx.get(serve.url + "/v1/profiles", params={"limit": 1}).json()["items"][0]
    assert job["request"]["analytic"] is True and job["request"]["model"] == "gpt"
    assert job["request"]["config"] == {"n_layer": 3, "n_embd": 64, "n_head": 4, "block_size": 32,
                                        "vocab_size": 100, "batch_size": 2, "dtype": "bfloat16"}
    # the page plans the job's result (the fake profile job: one stage per n_layer)
    assert "3 stages" in b.js("document.querySelector('#profile-info').textContent")
    assert b.errors() == []


def test_api_key_is_asked_once_and_sent_as_a_bearer_token(keyed_serve, browser):
    b = browser
    b.send("Page.navigate", url=keyed_serve.url + "/")
    b.wait("document.querySelector('#key-dialog')?.open === true", "the key dialog")
    b.js("document.querySelector('#api-key').focus()")
    b.type("s3cret")
    b.key("Enter", vk=13)
    b.wait("document.body.dataset.ready === '1'", "the examples, with the key")
    assert not b.js("document.querySelector('#key-dialog').open")
    assert b.js("document.querySelectorAll('#example option').length") == 3
    b.wait("document.querySelector('#jobs-error').textContent === ''", "the job list")
    sent = [e["params"]["request"] for e in b.events if e["method"] == "Network.requestWillBeSent"]
    api = [r for r in sent if "/v1/" in r["url"]]
    keyed = [r for r in api if r["headers"].get("Authorization") == "Bearer s3cret"]
    assert {r["url"].split("?")[0].removeprefix(keyed_serve.url) for r in keyed} >= {
        "/v1/examples", "/v1/runs", "/v1/profiles"}
    # the examples and the job lists were refused before the key was known: one dialog for all
    assert b.js("document.body.dataset.keyPrompts") == "1"
    # an artifact's link downloads with the key too (a plain link could not send it)
    key = {"Authorization": "Bearer s3cret"}
    r = httpx.post(keyed_serve.url + "/v1/runs", json={"steps": 1, "config": {"timeline": 4}}, headers=key)
    wait_for(lambda: httpx.get(f"{keyed_serve.url}/v1/runs/{r.json()['id']}", headers=key).json()["state"]
             == "succeeded", timeout_s=60, what="the run to finish")
    b.js("document.querySelector('#jobs-refresh').click()")
    li = f"document.getElementById('job-{r.json()['id']}')"
    b.wait(f"{li} && {li}.querySelector('a.artifact') !== null", "the run's download link")
    b.js(f"{li}.querySelector('a.artifact').click()")
    b.wait("document.body.dataset.downloads === '1' || document.querySelector('#jobs-error').textContent",
           "the download")
    assert b.js("document.querySelector('#jobs-error').textContent") == ""
    sent = [e["params"]["request"] for e in b.events if e["method"] == "Network.requestWillBeSent"
            and "/artifacts/" in e["params"]["request"]["url"]]
    assert sent and all(s["headers"].get("Authorization") == "Bearer s3cret" for s in sent)
    assert b.js("document.body.dataset.keyPrompts") == "1"
    assert b.errors() == []


# ---- regressions: the page's handling of refusals and of what it shows (report A-2..A-8) -------

def text(b: Browser, sel: str) -> str:
    return b.js(f"document.querySelector({json.dumps(sel)}).textContent")


def test_a_refused_profile_leaves_the_planned_one(serve, browser, tmp_path):
    """A profile the server refuses (or that is not a JSON object) does not replace the page's
    profile: the status names the refused field, and the profile line, the plan and the frontier
    stay those of the profile planned; the slider still plans that one."""
    b = browser
    open_page(b, serve.url)
    profile = make_profile(8)
    frontier = api_frontier(serve.url, profile)
    upload_and_plan(b, profile, tmp_path / "chain8.json")
    info = text(b, "#profile-info")
    before = check_against_api(b, serve.url, profile, frontier)

    negative = make_profile(12)
    negative["layers"][3]["saved_bytes"] = -5
    for name, bad, says in [("neg.json", negative, "body.profile.layers.3.saved_bytes"),
                            ("empty.json", {"name": "x", "layers": []}, "body.profile.layers"),
                            ("arr.json", [1, 2, 3], "not an array"), ("null.json", None, "not null")]:
        b.js("document.querySelector('#status').textContent = ''")
        upload_profile(b, bad, tmp_path / name)
        b.wait(f"document.querySelector('#status').textContent.startsWith('upload: {name} refused')", f"{name}'s refusal")
        status = text(b, "#status")
        assert says in status and status.endswith("still planning chain8"), status
        assert status.count(says) == 1, status
        assert text(b, "#profile-info") == info
        assert b.js("document.querySelector('#upload').value") == ""
        assert shown(b) == before
    # the slider plans the profile still shown, with no refusal
    seq = b.js("Number(document.querySelector('#plan-section').dataset.seq)")
    b.js("document.querySelector('#budget-range').focus()")
    b.key("Home", vk=36)
    b.wait(f"Number(document.querySelector('#plan-section').dataset.seq) > {seq}", "the plan at the least budget")
    check_against_api(b, serve.url, profile, frontier)
    assert not text(b, "#plan-message").startswith("plan:")
    assert b.errors() == []


def test_derive_profile_refuses_what_it_cannot_read(serve, browser):
    """"Derive profile" says why it sends nothing: a config.json that is not an object (null
    threw a TypeError), one with none of the names memplan maps (the server would plan its
    default GPT), and a batch size below 1 (0 became 1)."""
    b = browser
    open_page(b, serve.url)
    n_jobs = len(httpx.get(serve.url + "/v1/profiles", params={"limit": 500}).json()["items"])
    good = json.dumps({"n_layer": 2, "n_embd": 64, "n_head": 2})
    cases = [("null", "8", "config.json: must be a JSON object"), ("[1, 2]", "8", "not an array"),
             ("{}", "8", "config.json: none of num_hidden_layers/n_layer"),
             (json.dumps({"num_layers": 2, "d_model": 64}), "8", "(it has num_layers, d_model)"),
             (good, "0", 'batch size: must be a whole number of 1 or more, not "0"'),
             (good, "-2", "batch size: must be a whole number"), (good, "1.5", "batch size: must be a whole number")]
    b.js("document.querySelector('#hf').open = true")
    for cfg, batch, says in cases:
        b.js(f"document.querySelector('#status').textContent = '';"
             f"document.querySelector('#hf-config').value = {json.dumps(cfg)};"
             f"document.querySelector('#hf-batch').value = {json.dumps(batch)};"
             "document.querySelector('#hf-go').click()")
        b.wait("document.querySelector('#status').textContent !== ''", f"the answer to {cfg} / batch {batch}")
        assert says in text(b, "#status"), (cfg, batch, text(b, "#status"))
    assert text(b, "#profile-info") == "No profile loaded."
    assert len(httpx.get(serve.url + "/v1/profiles", params={"limit": 500}).json()["items"]) == n_jobs
    assert b.errors() == []


def test_a_refused_plan_request_greys_out_the_last_plan(serve, browser, tmp_path):
    """A budget or offload bandwidth the server refuses leaves the last plan drawn, marked as not
    updated (greyed out, with a note naming the plan it is) until a plan request succeeds; the
    message names the refused field once."""
    b = browser
    open_page(b, serve.url)
    profile = make_profile(8)
    upload_and_plan(b, profile, tmp_path / "chain8.json")
    stale = ("[document.querySelector('#plan-section').dataset.stale, document.querySelector('#timeline-section').dataset.stale,"
             " document.querySelector('#frontier-section').dataset.stale, document.querySelector('#plan-stale').hidden]")
    assert b.js(stale) == [None, None, None, True]
    budget = b.js("Number(document.querySelector('#plan-section').dataset.budget)")

    def typed(sel: str, value: str) -> None:
        b.js(f"(() => {{ const t = document.querySelector({json.dumps(sel)}); t.focus(); t.value = {json.dumps(value)};"
             " t.dispatchEvent(new Event('change')); })()")

    typed("#budget-text", "2e18")  # the page reads it; the server's limit is 2^60 bytes
    b.wait("document.querySelector('#plan-message').textContent.startsWith('plan:')", "the refusal")
    message = text(b, "#plan-message")
    assert message.startswith("plan: body.budget_bytes: at most 2^60") and message.count("body.budget_bytes") == 1
    assert b.js(stale) == ["1", "1", "1", False]
    note = text(b, "#plan-stale")
    assert note.startswith("Not updated: the last request was refused.") and "optimal" in note
    assert b.js("Number(document.querySelector('#plan-section').dataset.budget)") == budget
    assert float(b.js("getComputedStyle(document.querySelector('#summary')).opacity")) < 1
    # a budget that plans clears the mark
    typed("#budget-text", f"{budget}B")
    b.wait("document.querySelector('#plan-section').dataset.stale === undefined", "the plan, current again")
    assert b.js(stale) == [None, None, None, True]
    # an offload bandwidth the server refuses (at most 1e15 B/s), and one the page cannot read
    typed("#offload-text", "2e15")
    b.wait("document.querySelector('#plan-section').dataset.stale === '1'", "the bandwidth's refusal")
    assert text(b, "#plan-message").count("body.options.offload_bandwidth") == 1
    typed("#offload-text", "fast")
    b.wait("document.querySelector('#plan-stale').textContent.includes('offload bandwidth cannot be read')",
           "the bandwidth's own refusal")
    assert b.js("document.querySelector('#plan-section').dataset.stale") == "1"
    typed("#offload-text", "")
    b.wait("document.querySelector('#plan-section').dataset.stale === undefined", "the plan, current again")
    assert b.errors() == []


def test_a_finished_runs_verdict_is_shown(serve, browser):
    """The jobs list says a finished validation run's verdict: ok or mismatch in its state, and
    its message, predicted against measured peak and the gradient check; a mismatch does not read
    as a plain success. (The fake run of these tests has no report: its result is drawn from a
    RunReport-shaped job, as the end event and the job list give it.)"""
    b = browser
    open_page(b, serve.url)
    report = {"status": "mismatch", "message": "peak 273178 B measured, 263812 B predicted (+3.43%, beyond the 2% tolerance)",
              "predicted_peak_bytes": 263812, "measured_peak_bytes": 273178, "peak_error_pct": 3.43,
              "grad_max_abs_diff": 0.0, "grad_max_rel_diff": 0.0, "tolerance": 1e-6}
    job = {"id": "f" * 32, "kind": "run", "state": "succeeded", "progress": 1, "message": "done",
           "created_at": 0, "request": {}, "result": report, "artifacts": []}

    def item(j: dict) -> dict:
        return b.js(f"(() => {{ const li = jobItem({json.dumps(j)}); return {{verdict: li.dataset.verdict || null,"
                    " state: li.querySelector('.state').textContent, result: (li.querySelector('.result') || {}).textContent || ''}; })()")

    got = item(job)
    assert got["verdict"] == "mismatch" and got["state"] == "succeeded: mismatch"
    assert got["result"].startswith("mismatch: peak 273178 B measured")
    assert "257.63 KiB predicted, 266.78 KiB measured (+3.43%)" in got["result"]
    assert "gradients: max |diff| 0, relative 0" in got["result"]
    got = item({**job, "result": {**report, "status": "ok", "message": "bitwise equal"}})
    assert (got["verdict"], got["state"]) == ("ok", "succeeded: ok") and got["result"].startswith("ok: bitwise equal")
    hf = {"kind": "hf", "model": "gpt2", "strategy": "optimal", "predicted_peak_bytes": 10, "measured_peak_bytes": 10,
          "message": "the plan saves nothing here"}
    got = item({**job, "result": hf})
    assert got == {"verdict": None, "state": "succeeded", "result": "gpt2, optimal plan: the plan saves nothing here"}
    # a run of the fake job function (no report) still reads as it did
    r = httpx.post(serve.url + "/v1/runs", json={"steps": 1}).json()
    b.js("document.querySelector('#jobs-refresh').click()")
    li = f"document.getElementById('job-{r['id']}')"
    b.wait(f"{li} && {li}.dataset.state === 'succeeded'", "the fake run in the list", timeout_s=60)
    assert b.js(f"{li}.querySelector('.state').textContent") == "succeeded"
    assert b.errors() == []


def test_a_timeline_file_missing_what_the_chart_needs_is_refused(serve, browser, tmp_path):
    """A hand-edited timeline (no stage_of_op, a peak_op out of range) is refused, naming what
    is missing, before it replaces the timeline drawn: no exception, no half-drawn chart."""
    from memplan.planner import plan as make_plan
    from memplan.planner.timeline import plan_timeline
    from memplan.profiler.schema import load_profile

    prof = load_profile(make_profile(6))
    tl = json.loads(plan_timeline(prof, make_plan(prof, strategy="sqrt")).model_dump_json())
    b = browser
    open_page(b, serve.url)
    good = tmp_path / "good.timeline.json"
    good.write_text(json.dumps(tl))
    pick_file(b, good, "#run-timeline")
    b.wait("document.querySelector('#timeline-line') !== null", "the timeline")
    drawn = b.js("document.querySelector('#timeline-chart').innerHTML")
    cases = [({k: v for k, v in tl.items() if k != "stage_of_op"}, "no stage_of_op"),
             ({**tl, "stage_of_op": tl["stage_of_op"][:-1]}, "stage_of_op has"),
             ({**tl, "peak_op": 999}, f"peak_op is 999, not an op 0..{len(tl['ops']) - 1}"),
             ({**tl, "peak_op": -1}, "peak_op is -1"), ([1, 2], "the file holds an array")]
    for i, (bad, says) in enumerate(cases):
        path = tmp_path / f"bad{i}.json"
        path.write_text(json.dumps(bad))
        b.js("document.querySelector('#run-timeline').value = ''")
        pick_file(b, path, "#run-timeline")
        b.wait(f"document.querySelector('#timeline-source').textContent.includes({json.dumps(says)})", f"refusal: {says}")
        assert text(b, "#timeline-source").startswith("run timeline: not a memplan-timeline/1 file: ")
        assert b.js("document.querySelector('#timeline-chart').innerHTML") == drawn
    assert "undefined" not in text(b, "#timeline-chart")
    assert b.errors() == []


def test_sizing_prints_counts_as_integers_and_the_frontier_labels_fit(serve, browser):
    """The sizing answer prints integer counts as integers (n_layer 28, not 28.000), as `memplan
    size` does; every x label of the frontier chart lies inside its viewBox."""
    b = browser
    open_page(b, serve.url)
    b.js("document.querySelector('#sz-memory').value = '80GB'; document.querySelector('#sizing-form').requestSubmit()")
    b.wait("document.querySelector('#sizing-out [data-key=n_layer]') !== null", "the sizing answer")
    want = httpx.get(serve.url + "/v1/sizing", params={"memory_bytes": 80_000_000_000, "devices": 1}).json()
    got = b.js("Object.fromEntries([...document.querySelectorAll('#sizing-out dd')].map(d => [d.dataset.key, d.textContent]))")
    ints = {k: v for k, v in want.items() if isinstance(v, int) and not isinstance(v, bool)}
    assert {"n_layer", "d_model", "n_devices", "micro_batch", "zero_stage", "checkpoints"} <= set(ints)
    for k, v in ints.items():
        assert got[k] == str(v), (k, got[k])
    b.js("(() => { const s = document.querySelector('#example'); s.value = 'gpt24'; s.dispatchEvent(new Event('change')); })()")
    b.wait("Number(document.querySelector('#plan-section').dataset.seq) >= 1", "the example's plan", timeout_s=120)
    boxes = b.js("[...document.querySelectorAll('#frontier-chart text.x-tick')].map(t => { const r = t.getBBox();"
                 " return [r.x, r.x + r.width]; })")
    assert len(boxes) == 5 and all(0 <= lo and hi <= 860 for lo, hi in boxes), boxes
    assert b.errors() == []
