"""CLI parity: `memplan runs|info` and `memplan.client` against the live server."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memplan import planner
from memplan.cli import app
from memplan.client import Client, ServerError, ServerUnavailable
from tests.service.server import free_port

runner = CliRunner()


def test_client_plan_equals_library(server, profile):
    with Client(server.url) as c:
        assert c.plan(profile, budget_bytes=20_000, strategy="sqrt") == planner.plan(
            profile, budget_bytes=20_000, strategy="sqrt").model_dump(mode="json")
        with pytest.raises(ServerError) as err:
            c.plan(profile, strategy="sqrt", options={"k": 2})
        assert err.value.status == 422 and "takes no such option" in str(err.value)


def test_client_unreachable():
    with Client(f"http://127.0.0.1:{free_port()}", timeout_s=2) as c, pytest.raises(ServerUnavailable):
        c.health()


def test_runs_commands(server):
    with Client(server.url) as c:
        job = c.run({"steps": 2, "config": {"sleep_s": 0.01, "echo": "cli"}})
        assert job["state"] == "succeeded" and job["result"]["echo"] == "cli"
    res = runner.invoke(app, ["runs", "list", "--server", server.url, "--json", "--limit", "500"])
    assert res.exit_code == 0, res.output
    assert job["id"] in [j["id"] for j in json.loads(res.output)["items"]]
    res = runner.invoke(app, ["runs", "show", job["id"], "--server", server.url])
    assert res.exit_code == 0 and "succeeded" in res.output
    res = runner.invoke(app, ["runs", "watch", job["id"], "--server", server.url, "--json"])
    assert res.exit_code == 0
    events = [json.loads(line) for line in res.output.splitlines()]
    assert events[-1]["event"] == "end" and events[-1]["data"]["state"] == "succeeded"
    res = runner.invoke(app, ["runs", "cancel", job["id"], "--server", server.url])
    assert res.exit_code == 2 and "409" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["runs", "show", "nope", "--server", server.url])
    assert res.exit_code == 2 and "no run with id" in res.output


def test_info_command(server):
    res = runner.invoke(app, ["info", "--server", server.url, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["limits"]["max_stages"] == 20000
    res = runner.invoke(app, ["info", "--server", f"http://127.0.0.1:{free_port()}"])
    assert res.exit_code == 2 and "cannot reach" in res.output


def test_serve_rejects_bad_port():
    res = runner.invoke(app, ["serve", "--port", "70000"])
    assert res.exit_code == 2 and "--port" in res.output


def test_plan_with_offload_through_the_server_equals_local(server, tmp_path):
    # `memplan plan --server` sends the same validated request, offload options included
    from tests.planner.chains import worked_example

    path = tmp_path / "worked.json"
    path.write_text(worked_example().model_dump_json())
    args = ["plan", str(path), "--budget", "20", "--offload-bandwidth", "2B/s", "--host-memory",
            "6", "--json"]
    local = runner.invoke(app, args)
    remote = runner.invoke(app, [*args, "--server", server.url])
    assert local.exit_code == remote.exit_code == 0, remote.output
    got, want = json.loads(remote.stdout), json.loads(local.stdout)
    assert got["schedule"] == want["schedule"] and got["predicted"] == want["predicted"]
    assert got["predicted"]["time_s"] == 43 and got["options"]["host_memory_bytes"] == 6
