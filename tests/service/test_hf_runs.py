"""Run jobs from a Hugging Face config (issue 21, the REST side of `memplan run --hf-config`): the
config is typed and bounded, the model types are those the CLI path is tested on, the estimate
refuses what cannot fit before anything is queued (422 naming the field), and a tiny GPT-2 run
completes on the CPU with its measured peak at its prediction."""

from __future__ import annotations

import httpx
import pytest
from memplan.service.jobs.admission import AdmissionError, admit
from memplan.service.settings import Settings

from tests.service.server import Server, wait_finished

RUN = "memplan.service.jobs.kinds:run_job"
GPT2 = {"model_type": "gpt2", "vocab_size": 97, "n_positions": 64, "n_embd": 32, "n_layer": 3, "n_head": 4,
        "tie_word_embeddings": False}
LLAMA = {"model_type": "llama", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64}
XL = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 1600, "n_layer": 48, "n_head": 25}


def _settings(**kw) -> Settings:
    return Settings(job_max_bytes=kw.pop("job_max_bytes", 1 << 30), job_timeout_s=3600, device="cpu", **kw)


def _refused(request: dict, settings: Settings | None = None) -> AdmissionError:
    with pytest.raises(AdmissionError) as info:
        admit("run", request, settings or _settings(), job_path=RUN)
    return info.value


@pytest.mark.parametrize(("request_", "field"), [
    ({"config": {"hf_config": {**GPT2, "model_type": "bert"}}}, "body.config.hf_config.model_type"),
    ({"config": {"hf_config": {"n_layer": 2}}}, "body.config.hf_config.model_type"),
    ({"config": {"hf_config": {**GPT2, "n_layer": 5000}}}, "body.config.hf_config.n_layer"),
    ({"config": {"hf_config": {**GPT2, "n_embd": True}}}, "body.config.hf_config.n_embd"),
    ({"config": {"hf_config": {**LLAMA, "vocab_size": 2**21}}}, "body.config.hf_config.vocab_size"),
    ({"config": {"hf_config": {k: v for k, v in GPT2.items() if k != "n_embd"}}}, "body.config.hf_config.n_embd"),
    ({"config": {"hf_config": {k: v for k, v in LLAMA.items() if k != "hidden_size"}}},
     "body.config.hf_config.hidden_size"),
    ({"config": {"hf_config": {**LLAMA, "num_key_value_heads": 3}}}, "body.config.hf_config.num_key_value_heads"),
    ({"config": {"hf_config": {**GPT2, "auto_map": {"AutoModel": "x.Y"}}}}, "body.config.hf_config.auto_map"),
    ({"config": {"hf_config": {**GPT2, "junk": "x" * 70_000}}}, "body.config.hf_config"),
    ({"config": {"hf_config": GPT2, "seq": 65}}, "body.config.seq"),  # past GPT-2's learned positions
    ({"config": {"hf_config": GPT2, "seq": 0}}, "body.config.seq"),
    ({"config": {"hf_config": GPT2, "batch_size": 5000}}, "body.config.batch_size"),
    ({"config": {"hf_config": GPT2, "colour": "red"}}, "body.config.colour"),
    ({"config": {"hf_config": GPT2, "lean_loss": "yes"}}, "body.config.lean_loss"),
    ({"config": {"hf_config": GPT2, "reuse_logits": True}}, "body.config.reuse_logits"),
    ({"config": {"seq": 16}}, "body.config.hf_config"),
    ({"config": {"hf_config": GPT2}, "features": ["moe"]}, "body.features"),
    ({"config": {"hf_config": GPT2}, "autocast_dtype": "bfloat16"}, "body.autocast_dtype"),
    ({"config": {"hf_config": GPT2}, "device": "cuda"}, "body.device"),
    ({"config": {"hf_config": {**GPT2, "torch_dtype": "bogus"}}}, "body.config.hf_config.torch_dtype"),
    ({"config": {"hf_config": {**LLAMA, "dtype": "float33"}}}, "body.config.hf_config.dtype"),
    ({"config": {"hf_config": {**GPT2, "n_layer": 1}}}, "body.config.hf_config"),  # one block
    ({"config": {"hf_config": {**LLAMA, "num_hidden_layers": 1}}}, "body.config.hf_config"),
])
def test_bad_hf_run_configs_are_refused_naming_the_field(request_, field):
    err = _refused({"model": "hf", **request_})
    assert err.field == field, err


def test_the_estimate_refuses_what_cannot_fit_and_names_what_to_shrink():
    # GPT-2 XL's parameters, gradients and AdamW state alone are ~25 GB: the model, not the batch
    err = _refused({"model": "hf", "config": {"hf_config": XL, "seq": 8, "batch_size": 1}})
    assert err.field == "body.config.hf_config" and err.kind == "too-large"
    assert "give a smaller model" in err.message
    # a small model whose activations at this batch are what does not fit
    big_batch = {"model": "hf", "config": {"hf_config": {**LLAMA, "max_position_embeddings": 8192},
                                           "seq": 8192, "batch_size": 512}}
    err = _refused(big_batch)
    assert err.field == "body.config.batch_size" and "make batch_size or seq smaller" in err.message
    # enough memory, not enough time: the steps drive it
    err = _refused({"model": "hf", "config": {"hf_config": XL, "seq": 1024, "batch_size": 8}, "steps": 10_000},
                   _settings(job_max_bytes=1 << 50))
    assert err.field == "body.steps" and err.kind == "too-long"
    # at the configs' bounds the answer is a 422 naming the field, never an overflow, for every family
    top = {"gpt2": {"n_layer": 1024, "n_embd": 16384, "n_head": 256, "vocab_size": 1 << 20, "n_positions": 32768,
                    "n_inner": 1 << 18},
           "llama": {"num_hidden_layers": 1024, "hidden_size": 16384, "num_attention_heads": 256,
                     "vocab_size": 1 << 20, "intermediate_size": 1 << 18, "max_position_embeddings": 1 << 20}}
    for model_type, cfg in [*top.items(), ("qwen2", top["llama"])]:
        req = {"model": "hf", "config": {"hf_config": {"model_type": model_type, **cfg}, "seq": 32768,
                                         "batch_size": 4096}}
        assert _refused(req).field == "body.config.hf_config"  # the model alone, at 1 GiB
        err = _refused(req, _settings(job_max_bytes=1 << 62))  # room for any model: the activations
        assert (err.field, err.kind) == ("body.config.batch_size", "too-large"), err
    # the tiny ones are admitted, priced from their shapes on the CPU
    for cfg in (GPT2, LLAMA):
        est = admit("run", {"model": "hf", "config": {"hf_config": cfg, "seq": 16, "batch_size": 2}},
                    _settings(), job_path=RUN)
        assert est.device == "cpu" and 0 < est.activation_bytes < est.memory_bytes < 1 << 30
    # a Llama run with the lean loss is priced with the lean head: one fp32 N x V tensor (of the
    # three Hugging Face's loss holds in its backward) less, and one chunk (at most 8 MiB) more
    cfg = {**LLAMA, "vocab_size": 32000}
    est = {lean: admit("run", {"model": "hf", "config": {"hf_config": cfg, "seq": 64, "batch_size": 4,
                                                        "lean_loss": lean}}, _settings(), job_path=RUN)
           for lean in (False, True)}
    assert est[False].memory_bytes - est[True].memory_bytes >= 4 * (4 * 64) * 32000 - (8 << 20)
    # reusing the logits for their gradient: the head's backward holds one fp32 N x V less still
    reuse = admit("run", {"model": "hf", "config": {"hf_config": cfg, "seq": 64, "batch_size": 4,
                                                    "lean_loss": True, "reuse_logits": True}},
                  _settings(), job_path=RUN)
    assert est[True].memory_bytes - reuse.memory_bytes == 4 * (4 * 64) * 32000


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory):
    pytest.importorskip("transformers")
    srv = Server(tmp_path_factory.mktemp("svc-hf"), env={"MEMPLAN_RUN_JOB": RUN, "MEMPLAN_DEVICE": "cpu"}).start()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_a_tiny_gpt2_run_job_completes_with_its_measured_peak_at_the_prediction(hf_server):
    budget = 360_000  # below the store-all peak (494,344 bytes): something is recomputed
    body = {"model": "hf", "config": {"hf_config": GPT2, "seq": 16, "batch_size": 2}, "budget_bytes": budget,
            "strategy": "optimal", "steps": 2}
    with httpx.Client(base_url=hf_server.url, timeout=30) as c:
        r = c.post("/v1/runs", json=body)
        assert r.status_code == 202, r.text
        job = wait_finished(c, r.headers["location"], timeout_s=300, every_s=0.5)
        assert job["state"] == "succeeded", job["error"]
        run = job["result"]
        assert run["kind"] == "hf" and run["model"] == "gpt2" and run["strategy"] == "optimal"
        assert run["recomputed"] and len(run["losses"]) == 2 and run["budget_bytes"] == budget
        assert run["predicted_peak_bytes"] <= budget < run["store_all_peak_bytes"]
        # as `memplan run --hf-config` holds it: the user's step measured within 2% of the plan
        assert abs(run["measured_peak_bytes"] - run["predicted_peak_bytes"]) <= 0.02 * run["predicted_peak_bytes"]
        assert abs(run["peak_error_pct"]) <= 2.0
        # no op-by-op timeline for an installed plan: listed absent, with the reason
        arts = {a["name"]: a for a in job["artifacts"]}
        assert arts["timeline.json"]["href"] is None and "installs its plan" in arts["timeline.json"]["reason"]
        # refused at submission through the API too, naming the field
        bad = c.post("/v1/runs", json={**body, "config": {"hf_config": {**GPT2, "model_type": "bert"}}})
        assert bad.status_code == 422
        assert [e["field"] for e in bad.json()["errors"]] == ["body.config.hf_config.model_type"]


class _Ctx:
    """A job context that only takes progress reports."""

    def progress(self, *args, **kwargs) -> None:
        pass


def test_a_run_job_with_the_lean_loss_passes_it_to_the_model():
    """`config.lean_loss`: the job's model computes its loss with memplan.lean_loss, so the same
    model's store-all peak is lower (by one N x V tensor less a chunk) and the plan still within 2%."""
    from memplan.service.jobs.kinds import run_job

    runs = {}
    for lean in (False, True):
        body = {"model": "hf", "config": {"hf_config": GPT2, "seq": 16, "batch_size": 2, "lean_loss": lean},
                "budget_bytes": 360_000, "strategy": "optimal", "steps": 1}
        runs[lean] = run_job(body, _Ctx())
    assert runs[True]["store_all_peak_bytes"] < runs[False]["store_all_peak_bytes"]
    assert abs(runs[True]["peak_error_pct"]) <= 2.0
    # `config.reuse_logits`: the lean loss writes the logits' gradient over them; where the head
    # sets the peak (4,096 words), the store-all peak is lower still
    wide = {**GPT2, "vocab_size": 4096}
    heads = {}
    for reuse in (False, True):
        body = {"model": "hf", "config": {"hf_config": wide, "seq": 16, "batch_size": 2, "lean_loss": True,
                                          "reuse_logits": reuse}, "strategy": "store-all", "steps": 1}
        heads[reuse] = run_job(body, _Ctx())
        assert abs(heads[reuse]["peak_error_pct"]) <= 2.0
    assert heads[True]["store_all_peak_bytes"] < heads[False]["store_all_peak_bytes"]
