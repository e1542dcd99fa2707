"""Expert parallel over several processes: torch.distributed with gloo and the CPU kernels
(python/moejit/expert_parallel.py). Every rank's output must equal the single-rank layer's on the
same tokens, in both modes: all_reduce (ep x tp ranks, the same tokens everywhere) and all_to_all
(ep ranks, each its own tokens: odd counts, a rank with none; fp8 layers' rows sent quantized), with
routing that leaves ranks without a local pair, a residual counted once, and two calls bitwise equal; a rank killed mid-run ends the
others' call with an error naming the exchange, not a hang. The same code runs with NCCL on GPUs
(one rank here, where CUDA is; several ranks need a machine of several GPUs, not run yet)."""

import dataclasses
import datetime
import pathlib
import sys

import pytest
import torch
import torch.multiprocessing as mp

from conftest import TOLERANCE, rel_error

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _full_weights(cfg, seed):
    """[E, 2I, H] and [E, H, I] of the whole layer (ep 1, tp 1), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    E, H, I = cfg.experts, cfg.hidden, cfg.moe_intermediate
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.1).to(cfg.torch_dtype)
    w2 = (torch.randn(E, H, I, generator=g) * 0.1).to(cfg.torch_dtype)
    bias = torch.randn(E, generator=g) * 0.1
    return w13, w2, bias


def _rank_weights(cfg, w13, w2):
    """This rank's slice: its experts, and its part of I (gate rows, then up rows)."""
    E_loc, I, I_loc = cfg.local_experts, cfg.moe_intermediate, cfg.local_intermediate
    e = slice(cfg.ep_rank * E_loc, (cfg.ep_rank + 1) * E_loc)
    i = slice(cfg.tp_rank * I_loc, (cfg.tp_rank + 1) * I_loc)
    up = slice(I + cfg.tp_rank * I_loc, I + (cfg.tp_rank + 1) * I_loc)
    return torch.cat([w13[e, i], w13[e, up]], dim=1).contiguous(), w2[e, :, i].contiguous()


def _inputs(cfg, tokens, seed, hostile=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, cfg.hidden, generator=g).to(cfg.torch_dtype)
    logits = torch.randn(tokens, cfg.experts, generator=g)
    if hostile:
        # Every token's top-k among the last rank's experts (of 2 or more ranks): the others hold no pair.
        logits[:, -cfg.topk:] += 30.0
    # Small beside the experts' sum, so that the check sees the experts' errors.
    residual = (torch.randn(tokens, cfg.hidden, generator=g) * 0.05).to(cfg.torch_dtype)
    return hidden, logits.to(cfg.router_torch_dtype), residual


def _configs():
    from moejit import MoeConfig

    base = dict(experts=8, topk=3, hidden=40, moe_intermediate=24, dtype="fp32")
    return [
        MoeConfig(**base),
        MoeConfig(**dict(base, experts=8, topk=2, num_expert_group=4, topk_group=2, scoring="sigmoid",
                         topk_method="noaux_tc", routed_scaling_factor=2.5)),
        MoeConfig(**dict(base, dtype="bf16")),
    ]


def _fp8_layers(quant, seed):
    """An fp8 layer's config (bf16 model, 256-wide rows: two 128-column scale groups) and its whole
    e4m3 weights with fp32 scales (ep 1), the same on every rank."""
    from moejit import MoeConfig

    cfg = MoeConfig(experts=8, topk=3, hidden=256, moe_intermediate=128, dtype="bf16", quant=quant)
    g = torch.Generator().manual_seed(seed)
    shapes = cfg.quant_tensor_shapes()

    def e4m3(shape):
        return (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)

    weights = dict(w13=e4m3(cfg.w13_shape()), w2=e4m3(cfg.w2_shape()),
                   w13_scale=(0.5 + torch.rand(shapes["w13_scale"], generator=g)) * 1e-3,
                   w2_scale=(0.5 + torch.rand(shapes["w2_scale"], generator=g)) * 1e-3)
    return cfg, weights


def _fp8_all_to_all(errors, rank, world, group, counts, device):
    """fp8 layers in all_to_all mode (their rows sent quantized, with their scales) against the
    single-rank fp8 layer, both sizings of the exchange."""
    from moejit import MoELayer

    start = sum(counts[:rank])
    mine = slice(start, start + counts[rank])
    for n, quant in enumerate(("fp8_block", "fp8_tensor")):
        full_cfg, w = _fp8_layers(quant, seed=30 + n)
        w = {k: t.to(device) for k, t in w.items()}
        single = MoELayer(full_cfg, w["w13"], w["w2"], w13_scale=w["w13_scale"], w2_scale=w["w2_scale"])
        cfg = dataclasses.replace(full_cfg, ep_size=world, ep_rank=rank)
        e = slice(rank * cfg.local_experts, (rank + 1) * cfg.local_experts)
        local = {k: t[e].contiguous() for k, t in w.items()}
        hidden, logits, residual = (t.to(device) for t in _inputs(cfg, sum(counts), seed=300 + n))
        hidden = hidden * 4  # rows of several magnitudes: the scales matter
        for capacity in (max(counts), None):
            layer = MoELayer(cfg, local["w13"], local["w2"], w13_scale=local["w13_scale"],
                             w2_scale=local["w2_scale"], process_group=group, ep_mode="all_to_all",
                             max_tokens_per_rank=capacity)
            what = f"all_to_all {quant} C={capacity} ep {world} rank {rank}"
            out = layer(hidden[mine], logits[mine], residual[mine])
            _check(errors, what, out, single(hidden, logits, residual)[mine], torch.bfloat16)  # SPEC: fp8 2e-2


def _check(errors, what, out, ref, dtype):
    err = rel_error(out, ref)
    if not err <= TOLERANCE[dtype]:
        errors.append(f"{what}: relative error {err:.3e} against the single-rank layer (tolerance {TOLERANCE[dtype]})")


def _worker(rank, world, init_file, library, ep, tp, result_dir, backend="gloo", device="cpu"):
    """One rank: every case of both modes that fits a group of `world` ranks; writes its failures."""
    sys.path.insert(0, str(ROOT / "python"))
    if library:
        torch.ops.load_library(library)
    import torch.distributed as dist

    from moejit import MoELayer

    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    errors = []
    try:
        group = dist.group.WORLD
        for n, full_cfg in enumerate(_configs()):
            w13, w2, bias = (t.to(device) for t in _full_weights(full_cfg, seed=10 + n))
            single = MoELayer(full_cfg, w13, w2, e_score_correction_bias=bias)
            dt = full_cfg.torch_dtype
            # all_reduce: ep x tp ranks, the same 13 tokens on each; rank = ep_rank * tp + tp_rank.
            cfg = dataclasses.replace(full_cfg, ep_size=ep, ep_rank=rank // tp, tp_size=tp, tp_rank=rank % tp)
            a, b = _rank_weights(cfg, w13, w2)
            layer = MoELayer(cfg, a, b, e_score_correction_bias=bias, process_group=group, ep_mode="all_reduce")
            for hostile in (False, True):
                hidden, logits, residual = (t.to(device) for t in _inputs(cfg, 13, seed=100 + n, hostile=hostile))
                what = f"all_reduce ep {ep} tp {tp} {cfg.dtype} config {n} hostile={hostile}"
                _check(errors, what, layer(hidden, logits, residual), single(hidden, logits, residual), dt)
            if tp != 1:
                continue
            # all_to_all: rank r holds tokens [start_r, start_r + count_r) of 11 (rank 1 of 4 none);
            # fixed slabs of the largest count, and splits that follow the routing (None).
            counts = {1: [11], 2: [7, 4], 4: [5, 0, 3, 3]}[world]
            start = sum(counts[:rank])
            for capacity in (max(counts), None):
                layer = MoELayer(cfg, a, b, e_score_correction_bias=bias, process_group=group, ep_mode="all_to_all",
                                 max_tokens_per_rank=capacity)
                for hostile in (False, True):
                    hidden, logits, residual = (t.to(device) for t in _inputs(cfg, 11, seed=200 + n, hostile=hostile))
                    mine = slice(start, start + counts[rank])
                    kept = residual[mine].clone()
                    what = f"all_to_all C={capacity} ep {ep} {cfg.dtype} config {n} hostile={hostile} rank {rank}"
                    out = layer(hidden[mine], logits[mine], residual[mine])
                    _check(errors, what, out, single(hidden, logits, residual)[mine], dt)
                    again = layer(hidden[mine], logits[mine], residual[mine])
                    if not torch.equal(out, again):
                        errors.append(f"{what}: two calls differ")
                    if not torch.equal(residual[mine], kept):
                        errors.append(f"{what}: the call changed the caller's residual")
        if tp == 1:
            _fp8_all_to_all(errors, rank, world, group, {1: [11], 2: [7, 4], 4: [5, 0, 3, 3]}[world], device)
    except Exception as e:  # reported as the rank's failure, after the others have been told
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
        raise
    finally:
        (pathlib.Path(result_dir) / f"rank{rank}.txt").write_text("\n".join(errors))
        dist.destroy_process_group()


def _run_workers(ep, tp, tmp_path, request, backend="gloo", device="cpu"):
    """ep * tp ranks of _worker; fails with every rank's failures."""
    library = request.config.getoption("--moejit-library")
    world = ep * tp
    mp.start_processes(_worker, args=(world, str(tmp_path / "store"), library and str(pathlib.Path(library).resolve()),
                                      ep, tp, str(tmp_path), backend, device),
                       nprocs=world, join=True, start_method="spawn")
    failures = [line for r in range(world) for line in (tmp_path / f"rank{r}.txt").read_text().splitlines()]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("ep,tp", [(2, 1), (1, 2), (4, 1), (2, 2)])
def test_sum_over_ranks_equals_the_single_rank_layer(ep, tp, tmp_path, request):
    _run_workers(ep, tp, tmp_path, request)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_rank_nccl_group_on_cuda(tmp_path, request):
    """Both modes through NCCL on one GPU (a group of one rank: the collectives are copies), so the
    CUDA path of expert_parallel.py runs where several GPUs are not at hand."""
    _run_workers(1, 1, tmp_path, request, "nccl", "cuda")


def _refusal_worker(rank, world, init_file, library, result_dir):
    sys.path.insert(0, str(ROOT / "python"))
    if library:
        torch.ops.load_library(library)
    import torch.distributed as dist

    from moejit import MoeConfig, MoELayer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    messages = []
    base = dict(experts=8, topk=2, hidden=16, moe_intermediate=8, dtype="fp32")
    cases = [
        (dict(ep_size=4, ep_rank=rank), "all_reduce", None, "sums the outputs of ep_size * tp_size = 4 * 1 = 4"),
        (dict(ep_size=2, ep_rank=0), "all_reduce", None, "exactly once"),
        (dict(ep_size=2, ep_rank=1 - rank), "all_to_all", 4, "must be equal"),
        (dict(ep_size=1, tp_size=2, tp_rank=rank), "all_to_all", 4, "needs tp_size 1"),
        (dict(ep_size=2, ep_rank=rank), "all_to_all", 0, "takes max_tokens_per_rank, a positive int"),
        (dict(ep_size=2, ep_rank=rank), "all_to_all", None if rank else 4, "max_tokens_per_rank [4, None]"),
        (dict(ep_size=2, ep_rank=rank), "ring", None, "ep_mode 'ring' is not supported"),
        (dict(ep_size=2, ep_rank=rank), "all_to_all", 4 + rank, "max_tokens_per_rank [4, 5]"),
        # One rank's layer does not fit: both raise (rank 0's names rank 1's reason).
        (dict(ep_size=2, ep_rank=rank, tp_size=1 + rank, tp_rank=0), "all_to_all", 4,
         "needs tp_size 1" if rank else "on other ranks (rank 1: ep_mode all_to_all needs tp_size 1"),
    ]
    try:
        for kw, mode, capacity, message in cases:
            try:
                MoELayer(MoeConfig(**base, **kw), process_group=dist.group.WORLD, ep_mode=mode,
                         max_tokens_per_rank=capacity)
                messages.append(f"{kw} {mode}: accepted")
            except ValueError as e:
                if message not in str(e):
                    messages.append(f"{kw} {mode}: {e} (wanted '{message}')")
        # Rank 0 has too many tokens: it raises, and rank 1's call completes with the right output.
        g = torch.Generator().manual_seed(5)
        w13, w2 = torch.randn(8, 16, 16, generator=g) * 0.1, torch.randn(8, 16, 8, generator=g) * 0.1
        layer = MoELayer(MoeConfig(**base, ep_size=2, ep_rank=rank), w13[4 * rank:4 * rank + 4], w2[4 * rank:4 * rank + 4],
                         process_group=dist.group.WORLD, ep_mode="all_to_all", max_tokens_per_rank=2)
        single = MoELayer(MoeConfig(**base), w13, w2)
        hidden, logits = torch.randn(2, 16, generator=g), torch.randn(2, 8, generator=g)
        try:
            out = layer(torch.zeros(3, 16), torch.zeros(3, 8)) if rank == 0 else layer(hidden, logits)
            if rank == 0:
                messages.append("3 tokens over max_tokens_per_rank 2: accepted")
            elif not rel_error(out, single(hidden, logits)) <= TOLERANCE[torch.float32]:
                messages.append(f"rank 1's output is off by {rel_error(out, single(hidden, logits)):.2e} while rank 0 "
                                "overflowed")
        except ValueError as e:
            if rank != 0 or "more than max_tokens_per_rank = 2" not in str(e):
                messages.append(f"rank {rank}: {e}")
    finally:
        (pathlib.Path(result_dir) / f"rank{rank}.txt").write_text("\n".join(messages))
        dist.destroy_process_group()


def test_groups_that_do_not_fit_are_refused_with_the_reason(tmp_path, request):
    library = request.config.getoption("--moejit-library")
    mp.start_processes(_refusal_worker, args=(2, str(tmp_path / "store"),
                                              library and str(pathlib.Path(library).resolve()), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    failures = [line for r in range(2) for line in (tmp_path / f"rank{r}.txt").read_text().splitlines()]
    assert not failures, "\n".join(failures)


def test_without_torch_distributed_a_group_is_refused():
    import torch.distributed as dist

    from moejit import MoeConfig, MoELayer

    if dist.is_initialized():
        pytest.skip("this process has a default group")
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        MoELayer(MoeConfig(experts=8, topk=2, hidden=16, moe_intermediate=8, dtype="fp32", ep_size=2),
                 process_group=object())


def _killed_peer_worker(rank, world, init_file, library, result_dir, mode, backend="gloo"):
    """Rank 1 dies after building its layer; rank 0 then calls the layer and writes how it ended.
    With NCCL (a GPU per rank) the call only enqueues its collectives, so rank 0 then waits for the
    device: NCCL's watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=1: tear down) must end the process at the
    group's timeout instead of letting it hang."""
    import os
    import time

    sys.path.insert(0, str(ROOT / "python"))
    if library:
        torch.ops.load_library(library)
    import torch.distributed as dist

    from moejit import MoeConfig, MoELayer

    device = "cuda" if backend == "nccl" else "cpu"
    if backend == "nccl":
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    cfg = MoeConfig(experts=8, topk=2, hidden=16, moe_intermediate=8, dtype="fp32", ep_size=2, ep_rank=rank)
    layer = MoELayer(cfg, process_group=dist.group.WORLD, ep_mode=mode, max_tokens_per_rank=4).to(device)
    if rank == 1:
        os._exit(3)  # killed mid-run: after the layer is built, before its call's exchanges
    start = time.monotonic()
    result = pathlib.Path(result_dir) / "rank0.txt"
    try:
        out = layer(torch.randn(3, 16, device=device), torch.randn(3, 8, device=device))
        result.write_text(f"{time.monotonic() - start:.1f}\nenqueued")
        if device == "cuda":
            out.cpu()  # waits for the exchanges, which can never complete
        outcome = "returned"
    except Exception as e:  # what the surviving rank's caller sees
        outcome = f"{type(e).__name__}: {e}".replace("\n", " ")
    result.write_text(f"{time.monotonic() - start:.1f}\n{outcome}")


def _run_with_a_killed_rank(mode, backend, tmp_path, request):
    """Two ranks of _killed_peer_worker; fails unless both ended within 180 s (rank 1 by its kill).
    Returns rank 0's process and its rank0.txt path."""
    library = request.config.getoption("--moejit-library")
    spawn = mp.get_context("spawn")
    args = (2, str(tmp_path / "store"), library and str(pathlib.Path(library).resolve()), str(tmp_path), mode,
            backend)
    procs = [spawn.Process(target=_killed_peer_worker, args=(rank,) + args) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"rank(s) {hung} still running 180 s after rank 1 died (the group's timeout is 30 s)"
    assert procs[1].exitcode == 3
    return procs[0], tmp_path / "rank0.txt"


@pytest.mark.parametrize("mode", ["all_reduce", "all_to_all"])
def test_a_killed_rank_ends_the_others_call_with_an_error_not_a_hang(mode, tmp_path, request):
    _, result = _run_with_a_killed_rank(mode, "gloo", tmp_path, request)
    elapsed, outcome = result.read_text().split("\n", 1)
    assert outcome != "returned", "rank 0's call returned although its peer was dead"
    assert f"moejit: ep_mode {mode}:" in outcome and "a rank may have died or timed out" in outcome, outcome
    assert float(elapsed) < 10, f"rank 0's call took {elapsed} s to fail (its timeout is 30 s): {outcome}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a machine of several GPUs")
@pytest.mark.parametrize("mode", ["all_reduce", "all_to_all"])
def test_a_killed_rank_under_nccl_ends_the_others_at_the_timeout(mode, tmp_path, request):
    """Under NCCL a dead peer surfaces only through torch's watchdog at the group's timeout (30 s): rank
    0 must then end (an error, or the watchdog's tear-down of the process), not hang."""
    rank0, result = _run_with_a_killed_rank(mode, "nccl", tmp_path, request)
    assert result.exists(), f"rank 0 ended (exit {rank0.exitcode}) before calling the layer"
    outcome = result.read_text().split("\n", 1)[1]
    # Either the call raised naming the exchange, or it enqueued its collectives and the watchdog then
    # tore the waiting process down (a non-zero exit); never a completed call.
    assert outcome != "returned", "rank 0's call completed although its peer was dead"
    if outcome == "enqueued":
        assert rank0.exitcode != 0, "rank 0 waited on a dead peer and exited cleanly"
    else:
        assert f"moejit: ep_mode {mode}:" in outcome and "a rank may have died or timed out" in outcome, outcome


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a machine of several GPUs")
@pytest.mark.parametrize("ep,tp", [(2, 1), (1, 2), (4, 1), (2, 2)])
def test_sum_over_ranks_with_nccl_on_several_gpus(ep, tp, tmp_path, request):
    """The CPU test's cases with NCCL, a GPU per rank."""
    if ep * tp > torch.cuda.device_count():
        pytest.skip(f"needs {ep * tp} GPUs ({torch.cuda.device_count()} here)")
    _run_workers(ep, tp, tmp_path, request, "nccl", "cuda")
