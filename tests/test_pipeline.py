"""Each step of a compile request (cachemgr/compile/pipeline.py), alone, on real files: the
request's options, the rules with a real ``.cfg``, the real gcc identified, the inputs hashed
and the headers found by a real dependency listing or a manifest, the key, a lookup, a real
compile and its publish into a real chip folder."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from pathlib import Path

import pytest

from cachemgr.compile import build, keys, pipeline
from cachemgr.compile.request import CompileRequest, parse_request
from cachemgr.compile.results import Status
from cachemgr.config.options import Settings
from cachemgr.errors import InvalidInputError
from cachemgr.storage import manifest
from tests.compile_util import calls, counting_cc, make_settings, scale_request

KERNEL = '#include "scale.h"\nvoid scale_kernel(float *x) { x[0] *= FACTOR; }\n'


def _project(tmp: Path) -> Path:
    """A source with one project header, both older than the digest memo's racy window."""
    src = tmp / "proj" / "scale.c"
    src.parent.mkdir()
    src.write_text(KERNEL)
    (src.parent / "scale.h").write_text("#define FACTOR 2\n")
    _age(src, src.parent / "scale.h")
    return src


def _age(*paths: Path) -> None:
    old = time.time() - 10
    for path in paths:
        os.utime(path, (old, old))


def _request(src: Path, **over: object) -> CompileRequest:
    return parse_request(scale_request(str(src), **over), src.parent)


def _settings(tmp: Path, env: dict[str, str], **cli: object) -> Settings:
    return make_settings(tmp, env, compilers={"cc": str(counting_cc(tmp / "cc"))}, **cli)


def _tools(tmp: Path, env: dict[str, str], req: CompileRequest) -> pipeline.Toolchain:
    settings = _settings(tmp, env)
    decided = pipeline.decide(pipeline.options(req, settings, pipeline.JobOptions()))
    compilers = keys.Compilers(settings.sections.get("compilers", {}))
    return pipeline.toolchain(decided, settings, compilers)


def test_options_step_resolves_the_requests_own_options_over_the_settings(
    tmp_path, clean_env
) -> None:
    src = _project(tmp_path)
    settings = make_settings(tmp_path, clean_env, op_compiler_cache_mode="enable")
    req = _request(src, options={"op_compiler_cache_mode": "disable"})
    resolved = pipeline.options(req, settings, pipeline.JobOptions(replace=True))
    assert resolved.opts.op_compiler_cache_mode == "disable"
    assert resolved.request is req and resolved.job.replace


def test_decision_step_reads_the_cfg_file_and_keeps_its_bytes(tmp_path, clean_env) -> None:
    src = _project(tmp_path)
    cfg = tmp_path / "debug.cfg"
    cfg.write_bytes(b"op_debug_config = ccec_g\n")
    req = _request(src, options={"op_debug_config": str(cfg)})
    resolved = pipeline.options(req, make_settings(tmp_path, clean_env), pipeline.JobOptions())
    decided = pipeline.decide(resolved)
    assert decided.decision.debug.on and not decided.decision.cache.read
    assert decided.cfg_bytes == cfg.read_bytes()
    cfg.write_bytes(b"x" * (pipeline.MAX_DEBUG_CONFIG_BYTES + 1))
    with pytest.raises(InvalidInputError, match=f"op_debug_config {cfg}: over 64 KiB"):
        pipeline.decide(resolved)


def test_compiler_step_identifies_the_configured_compiler_and_the_chip_folder(
    tmp_path, clean_env
) -> None:
    src = _project(tmp_path)
    tools = _tools(tmp_path, clean_env, _request(src))
    assert tools.identity.path == str(tmp_path / "cc" / "cc-gcc")
    assert tools.chip_dir == tmp_path / "cache" / "kernel_cache" / "Ascend910B1"
    assert "HOME" not in tools.envkey  # only what the compiler reads is keyed
    with pytest.raises(InvalidInputError, match="soc_version"):
        _tools(tmp_path, clean_env, _request(src, soc_version="../x"))


def test_inputs_step_lists_the_headers_then_finds_them_in_the_manifest(tmp_path, clean_env) -> None:
    src = _project(tmp_path)
    tools = _tools(tmp_path, clean_env, _request(src))
    first = pipeline.gather(tools)
    header = str(src.parent / "scale.h")
    assert first.scanned and set(first.inputs.headers or {}) == {header}
    assert first.manifest_path.parent == tools.chip_dir
    prepared = pipeline.key(first)
    manifest.record(prepared.manifest_path, prepared.kernel, first.inputs.headers or {}, ())
    again = pipeline.gather(tools)
    assert not again.scanned and again.inputs.headers == first.inputs.headers


def test_inputs_step_needs_no_listing_for_a_source_of_system_headers_only(
    tmp_path, clean_env
) -> None:
    src = tmp_path / "plain.c"
    src.write_text("#include <string.h>\nvoid scale_kernel(float *x) { x[0] *= 2; }\n")
    _age(src)
    tools = _tools(tmp_path, clean_env, _request(src))
    gathered = pipeline.gather(tools)
    assert gathered.scanned and gathered.inputs.headers == {}
    assert calls(tmp_path / "cc", "-M") == []  # the wrapper logs every run but --version/-MM


def test_key_step_covers_each_header_but_the_manifest_name_does_not(tmp_path, clean_env) -> None:
    src = _project(tmp_path)
    tools = _tools(tmp_path, clean_env, _request(src))
    gathered = pipeline.gather(tools)
    before = pipeline.key(gathered)
    assert before.kernel == keys.kernel_name("Scale", before.key)
    header = str(src.parent / "scale.h")
    other = hashlib.sha256(b"#define FACTOR 3\n").hexdigest()
    changed = dataclasses.replace(gathered.inputs, headers={header: other})
    after = pipeline.key(dataclasses.replace(gathered, inputs=changed))
    assert after.key != before.key
    assert pipeline.base_key(tools, changed) == pipeline.base_key(tools, gathered.inputs)


def test_freeze_step_refuses_bytes_that_changed_since_they_were_hashed(tmp_path, clean_env) -> None:
    src = _project(tmp_path)
    prepared = pipeline.key(pipeline.gather(_tools(tmp_path, clean_env, _request(src))))
    frozen = pipeline.freeze(prepared)
    assert frozen is not None and (frozen.inputs.data or {})[str(src)] == src.read_bytes()
    (src.parent / "scale.h").write_text("#define FACTOR 3\n")
    assert pipeline.freeze(prepared) is None


def test_lookup_run_and_publish_steps_put_a_real_entry_in_the_chip_folder(
    tmp_path, clean_env
) -> None:
    src = _project(tmp_path)
    settings = _settings(tmp_path, clean_env)
    compilers = keys.Compilers(settings.sections.get("compilers", {}))
    prepared = pipeline.prepare(_request(src), settings, compilers, pipeline.JobOptions())
    assert pipeline.lookup(prepared, []) is None
    frozen = pipeline.freeze(prepared)
    assert frozen is not None
    ctx = build.RunContext(None, 10.0)
    try:
        pending = pipeline.run(frozen, ctx)
        assert not (prepared.chip_dir / f"{prepared.kernel}.json").exists()  # not yet published
        assert not isinstance(pending, build.CompileOutcome)
        outcome = pipeline.publish(pending, ctx)
    finally:
        ctx.close()
    assert outcome.status == Status.COMPILED and outcome.cached
    assert (prepared.chip_dir / f"{prepared.kernel}.json").is_file()
    assert len(calls(tmp_path / "cc")) == 1
    hit = pipeline.lookup(prepared, [])
    assert hit is not None and hit.status == Status.HIT and hit.kernel_name == prepared.kernel


def test_run_step_compiles_a_disable_request_outside_the_cache(tmp_path, clean_env) -> None:
    src = _project(tmp_path)
    settings = _settings(tmp_path, clean_env)
    compilers = keys.Compilers(settings.sections.get("compilers", {}))
    req = _request(src, options={"op_compiler_cache_mode": "disable"})
    prepared = pipeline.prepare(req, settings, compilers, pipeline.JobOptions())
    frozen = pipeline.freeze(prepared)
    assert frozen is not None and pipeline.lookup(frozen, []) is None
    ctx = build.RunContext(tmp_path / "out", 10.0)
    try:
        outcome = pipeline.run(frozen, ctx)
    finally:
        ctx.close()
    assert isinstance(outcome, build.CompileOutcome) and outcome.status == Status.COMPILED
    assert (tmp_path / "out" / f"{prepared.kernel}.json").is_file()
    assert not prepared.chip_dir.exists()
