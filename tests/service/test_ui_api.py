"""The page's server side: `/` and its assets (shipped in the package, same origin only),
`/v1/examples`, and `POST /v1/plans/timeline` (the plan of POST /v1/plans and its replay op by op)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from memplan.planner.simulate import simulate
from memplan.service.app import create_app
from memplan.service.routers.ui import STATIC_DIR
from memplan.service.settings import Settings

from tests.service.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui-api"), start_worker=False)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def keyed_client(tmp_path_factory):
    settings = Settings(data_dir=tmp_path_factory.mktemp("ui-api-key"), start_worker=False, api_key="k3y")
    with TestClient(create_app(settings)) as c:
        yield c


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]


def test_page_and_every_asset_it_names_are_served_from_this_origin(app_client):
    r = app_client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    parser = _Refs()
    parser.feed(r.text)
    assert {"/ui/app.js", "/ui/app.css", "/ui/favicon.svg"} <= set(parser.refs)
    for ref in parser.refs:
        assert ref.startswith(("/", "#")) and not ref.startswith("//"), ref
        if ref.startswith("/ui/"):
            got = app_client.get(ref)
            assert got.status_code == 200, ref
            assert got.headers["content-security-policy"] == r.headers["content-security-policy"]
    assert app_client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    assert app_client.get("/ui/app.css").headers["content-type"].startswith("text/css")


def test_no_shipped_file_points_outside_the_server():
    # the only absolute URL allowed is SVG's XML namespace, an identifier the browser never fetches
    allowed = {"http://www.w3.org/2000/svg"}
    files = [p for p in STATIC_DIR.rglob("*") if p.suffix in (".html", ".js", ".css", ".svg")]
    assert {p.name for p in files} >= {"index.html", "app.js", "app.css", "favicon.svg"}
    for path in files:
        urls = set(re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s\"'<>)]*", path.read_text()))
        assert urls <= allowed, f"{path.name} names {sorted(urls - allowed)}"


@pytest.mark.parametrize("name", ["../app.py", "..%2Fapp.py", "routers/ui.py", "nope.js", "examples"])
def test_only_shipped_assets_are_served(app_client, name):
    r = app_client.get(f"/ui/{name}")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")


def test_examples_are_the_repository_examples(app_client):
    listed = app_client.get("/v1/examples").json()
    repo = sorted(p.stem for p in (ROOT / "examples").glob("*.json"))
    assert [e["name"] for e in listed] == repo
    for e in listed:
        body = app_client.get(f"/v1/examples/{e['name']}").json()
        assert body == json.loads((ROOT / "examples" / f"{e['name']}.json").read_text()), (
            f"service/static/examples/{e['name']}.json is out of date: copy examples/{e['name']}.json"
        )
        assert e["n_stages"] == len(body["layers"]) and e["fixed_bytes"] == body["fixed_bytes"]
    r = app_client.get("/v1/examples/nope")
    assert r.status_code == 404 and "GET /v1/examples" in r.json()["detail"]


CASES = [("store-all", None, {}), ("sqrt", None, {}), ("uniform", None, {"k": 3}),
         ("heuristic", 30_000, {}), ("optimal", 24_000, {})]


@pytest.mark.parametrize(("strategy", "budget", "options"), CASES)
def test_timeline_is_the_plan_and_its_replay(app_client, strategy, budget, options):
    profile = make_profile(10)
    body = {"profile": profile, "budget_bytes": budget, "strategy": strategy, "options": options}
    r = app_client.post("/v1/plans/timeline", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    plan, tl = got["plan"], got["timeline"]
    plain = app_client.post("/v1/plans", json=body).json()
    assert {**plan, "message": ""} == {**plain, "message": ""}  # the message may carry seconds
    assert plan["feasible"], plan["message"]
    sim = simulate(profile, plan["schedule"])
    assert tl["predicted_bytes"] == sim.timeline
    assert tl["peak_bytes"] == max(tl["predicted_bytes"]) == plan["predicted"]["peak_bytes"]
    assert tl["predicted_bytes"][tl["peak_op"]] == tl["peak_bytes"]
    assert tl["predicted_bytes"].index(tl["peak_bytes"]) == tl["peak_op"]
    assert tl["ops"] == [" ".join(map(str, op)) for op in plan["schedule"]]
    assert tl["stage_of_op"] == [op[1] if len(op) > 1 else 0 for op in plan["schedule"]]
    assert [s["forwards"] for s in tl["stages"]] == sim.forward_counts
    assert [s["stage"] for s in tl["stages"] if s["role"] == "recomputed"] == plan["recomputed"]
    assert [s["stage"] for s in tl["stages"] if s["checkpoint"]] == plan["checkpoints"]
    assert tl["fixed_bytes"] == profile["fixed_bytes"] and tl["budget_bytes"] == budget
    assert (tl["time_s"], tl["overhead"]) == (plan["predicted"]["time_s"], plan["predicted"]["overhead"])


def test_store_all_stages_are_all_stored(app_client):
    tl = app_client.post("/v1/plans/timeline",
                         json={"profile": make_profile(5), "strategy": "store-all"}).json()["timeline"]
    assert [s["role"] for s in tl["stages"]] == ["stored"] * 5
    ops = [op for op in tl["ops"] if not op.startswith("drop")]
    assert ops == ["R 1", "R 2", "R 3", "R 4", "R 5", "loss", "B 5", "B 4", "B 3", "B 2", "B 1"]


def test_an_infeasible_plan_has_no_timeline(app_client):
    r = app_client.post("/v1/plans/timeline",
                        json={"profile": make_profile(6), "budget_bytes": 1, "strategy": "heuristic"})
    assert r.status_code == 200
    assert r.json()["plan"]["feasible"] is False and r.json()["timeline"] is None


@pytest.mark.parametrize(("patch", "field"), [
    ({"budget_bytes": -1}, "body.budget_bytes"),
    ({"budget_bytes": "8GiB"}, "body.budget_bytes"),
    ({"colour": "red"}, "body.colour"),
    ({"strategy": "fastest"}, "body.strategy"),
])
def test_timeline_errors_name_the_field(app_client, patch, field):
    r = app_client.post("/v1/plans/timeline", json={"profile": make_profile(4), **patch})
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert field in [e["field"] for e in r.json()["errors"]]


def test_the_page_needs_no_key_and_the_api_does(keyed_client):
    assert keyed_client.get("/").status_code == 200
    assert keyed_client.get("/ui/app.js").status_code == 200
    r = keyed_client.get("/v1/examples")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert keyed_client.post("/v1/plans/timeline", json={"profile": make_profile(4)}).status_code == 401
    assert keyed_client.get("/v1/examples", headers={"Authorization": "Bearer k3y"}).status_code == 200
    assert keyed_client.get("/v1/examples", headers={"X-API-Key": "k3y"}).status_code == 200


def test_openapi_documents_the_new_routes_not_the_page(app_client):
    paths = app_client.get("/openapi.json").json()["paths"]
    assert "/v1/plans/timeline" in paths and "/v1/examples" in paths and "/v1/examples/{name}" in paths
    assert "/" not in paths and not any(p.startswith("/ui") for p in paths)


def test_every_page_file_is_package_data():
    # a wheel carries only what [tool.setuptools.package-data] names: the page must work from one
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "memplan.service"]
    files = [p.relative_to(STATIC_DIR.parent).as_posix() for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/")
                                           for g in globs)]
    assert missing == [], f"add globs for {missing} to package-data 'memplan.service' in pyproject.toml"
